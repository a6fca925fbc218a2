// summarize(): the model's module walk gives the rows, their names, types and parameters; one forward pass
// over a batch of the size asked for, with an observer, gives each module's output shape (that of the
// last probe it or its parts report) and the multiply-adds of the matrix products it runs (the products
// recorded on the tape since the previous probe belong to the module reporting the next):
//   a linear layer (in → out) over N positions:     N · in · out
//   Q Kᵀ and weights · V, Tq queries over Tk keys:  H · Tq · Tk · D each
// Element-wise work (softmax, layer norm, activations) is left out, as torchinfo leaves it out. This file
// names no part of the model: what the walk lists is what the table shows.
#include "tapeformer/teach/summary.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tapeformer/autograd.h"

TF_NAMESPACE_BEGIN

namespace {

// Multiply-adds of one tape record's matrix product; 0 for every other op.
std::int64_t product_mult_adds(const TapeRecord& r) {
    const std::string op = r.op;
    if (op == "affine" || op == "affine_relu_dropout")  // x (..., in) @ W (out, in)ᵀ: in per output value
        return r.out.numel() * r.in[1].size(1);
    if (op == "matmul") {  // (..., M, K) @ (..., K, N) -> (..., M, N), either operand possibly transposed
        const Tensor& a = r.in[0];
        return r.out.numel() * (a.size(-2) == r.out.size(-2) ? a.size(-1) : a.size(-2));
    }
    if (op == "additive_scores") return r.out.numel() * r.in[0].size(-1);  // v · tanh(q_i + k_j): D per score
    return 0;
}

bool within(const std::string& name, const std::string& outer) {  // name is outer or one of its parts
    return outer.empty() || name == outer || name.rfind(outer + ".", 0) == 0;
}

// Listens to the pass: per module, its own multiply-adds, the shape of the last probe it or its parts
// reported, and when data first reached it.
class Profiler : public ForwardObserver {
public:
    explicit Profiler(const ModuleWalk& walk) : walk_(walk), done_(tape().records().size()) {}
    void probe(const void* module, const char* type, const char* name, const Tensor& value) override {
        (void)name;
        const ModuleEntry* e = walk_.find(module, type);
        if (!e) return;
        const std::vector<TapeRecord>& records = tape().records();
        for (; done_ < records.size(); ++done_) own_mult_adds[e->name] += product_mult_adds(records[done_]);
        for (const ModuleEntry& m : walk_.modules)
            if (within(e->name, m.name)) {
                output[m.name] = value.shape();
                first.emplace(m.name, first.size());
            }
    }
    std::map<std::string, std::int64_t> own_mult_adds;
    std::map<std::string, Shape> output;
    std::map<std::string, std::size_t> first;

private:
    const ModuleWalk& walk_;
    std::size_t done_;
};

}  // namespace

ModelSummary summarize(Transformer& model, std::int64_t B, std::int64_t S, std::int64_t T) {
    const ModelConfig& c = model.config;
    if (B < 1 || S < 1 || T < 1)
        throw std::invalid_argument("summary: batch, source and target lengths must be >= 1, got " + std::to_string(B) +
                                    ", " + std::to_string(S) + ", " + std::to_string(T));
    if (S > c.max_len || T > c.max_len)
        throw std::invalid_argument("summary: the model covers at most " + std::to_string(c.max_len) +
                                    " positions, asked for S " + std::to_string(S) + ", T " + std::to_string(T));
    const ModuleWalk walk(model);
    Profiler profile(walk);
    {
        Pass pass;  // evaluation, recorded on the tape so that the products can be counted
        pass.observer = &profile;
        const std::vector<std::int32_t> src(std::size_t(B * S), c.eos_id), dec_in(std::size_t(B * T), c.bos_id);
        model.forward(src, B, S, dec_in, T, pass);
        tape().clear();
    }
    ModelSummary s;
    s.B = B, s.S = S, s.T = T;
    // A parameter's storage, as the first parameter of the walk that has it (tied tables share one).
    auto storage_of = [&](std::size_t i) {
        std::size_t j = 0;
        while (!walk.parameters[j].tensor.same_storage(walk.parameters[i].tensor)) ++j;
        return j;
    };
    std::set<std::size_t> counted;  // storages of the rows of depth 1 so far: a tied table is counted once
    auto add_row = [&](int depth, const std::string& name, const std::string& kind, const std::string& stack,
                       const std::vector<std::size_t>& params, const std::string& module, bool own_work_only) {
        SummaryRow r;
        r.depth = depth, r.name = name, r.kind = kind, r.stack = stack;
        bool all_counted = !params.empty();
        for (std::size_t i : params) {
            r.params += walk.parameters[i].tensor.numel();
            if (depth == 1) all_counted = !counted.insert(storage_of(i)).second && all_counted;
        }
        r.shared = depth == 1 && all_counted;
        for (const auto& [m, n] : profile.own_mult_adds)
            if (own_work_only ? m == module : within(m, module)) r.mult_adds += n;
        if (auto it = profile.output.find(module); it != profile.output.end()) r.output = it->second;
        s.rows.push_back(std::move(r));
    };
    // The parts of `parent` (one level down), in the order the data reached them; parts it never reached last.
    auto parts_of = [&](const ModuleEntry& parent) {
        std::vector<const ModuleEntry*> parts;
        for (const ModuleEntry& e : walk.modules)
            if (e.depth == parent.depth + 1 && within(e.name, parent.name)) parts.push_back(&e);
        auto reached = [&](const ModuleEntry* e) {
            auto it = profile.first.find(e->name);
            return it == profile.first.end() ? profile.first.size() : it->second;
        };
        std::stable_sort(parts.begin(), parts.end(), [&](auto* x, auto* y) { return reached(x) < reached(y); });
        return parts;
    };

    const ModuleEntry& root = walk.modules[0];
    add_row(0, "", root.type, "", root.parameters, "", false);
    s.rows[0].params = model.parameter_count();  // distinct values
    for (const ModuleEntry* part : parts_of(root)) {
        add_row(1, part->name, part->type, part->stack, part->parameters, part->name, false);
        for (const ModuleEntry* sub : parts_of(*part))
            add_row(2, sub->name, sub->type, sub->stack, sub->parameters, sub->name, false);
    }
    // The model's own parameters (in no part: the output projection), one row per name before its last '.',
    // with the products the model runs itself.
    std::set<std::size_t> in_parts;
    for (const ModuleEntry& e : walk.modules)
        if (e.depth > 0) in_parts.insert(e.parameters.begin(), e.parameters.end());
    std::map<std::string, std::vector<std::size_t>> own;
    std::vector<std::string> own_order;
    for (std::size_t i : root.parameters)
        if (!in_parts.count(i)) {
            const std::string& n = walk.parameters[i].name;
            const std::string group = n.substr(0, n.rfind('.'));
            if (!own.count(group)) own_order.push_back(group);
            own[group].push_back(i);
        }
    for (std::size_t g = 0; g < own_order.size(); ++g) {
        add_row(1, own_order[g], std::string(root.type) + " parameters", own_order[g], own[own_order[g]], "", true);
        if (g > 0) s.rows.back().mult_adds = 0;  // the model's own products are shown once
        s.rows.back().output = s.rows[0].output;
    }
    s.total_params = s.rows[0].params;
    s.trainable_bytes = s.total_params * std::int64_t(sizeof(float));
    return s;
}

std::string format_summary(const ModelSummary& s) {
    auto with_commas = [](std::int64_t n) {
        std::string digits = std::to_string(n), out;
        for (std::size_t i = 0; i < digits.size(); ++i) {
            if (i && (digits.size() - i) % 3 == 0) out += ',';
            out += digits[i];
        }
        return out;
    };
    std::ostringstream o;
    const std::string rule(112, '=');
    char line[256];
    o << rule << "\n";
    std::snprintf(line, sizeof line, "%-62s %-18s %14s %15s\n", "Layer (type)", "Output shape", "Param #", "Mult-Adds");
    o << line << rule << "\n";
    for (std::size_t i = 0; i < s.rows.size(); ++i) {
        const SummaryRow& r = s.rows[i];
        // A part is named under its parent: "encoder.layers.0.self_attn" shows as "self_attn".
        std::string name = r.name;
        for (std::size_t p = i; p-- > 0;)
            if (s.rows[p].depth == r.depth - 1) {
                if (r.depth > 1) name = name.substr(s.rows[p].name.size() + 1);
                break;
            }
        const std::string label = std::string(std::size_t(2 * r.depth), ' ') + (r.depth ? "└─" : "") +
                                  (name.empty() ? r.kind : name + " (" + r.kind + ")");
        const std::string params = r.shared ? "(tied)" : r.params ? with_commas(r.params) : "--";
        const std::string macs = r.mult_adds ? with_commas(r.mult_adds) : "--";
        // printf pads by bytes; "└─" is 2 characters in 6 bytes
        const int pad = 62 + (r.depth ? 4 : 0);
        std::snprintf(line, sizeof line, "%-*s %-18s %14s %15s\n", pad, label.c_str(), r.output.str().c_str(),
                      params.c_str(), macs.c_str());
        o << line;
    }
    o << rule << "\n";
    o << "Total params: " << with_commas(s.total_params) << " (" << std::fixed;
    o.precision(2);
    o << double(s.trainable_bytes) / 1e6 << " MB as float32)\n";
    o << "Total mult-adds for a batch of " << s.B << " x (S " << s.S << ", T " << s.T << "): " << with_commas(s.rows[0].mult_adds)
      << " (" << double(s.rows[0].mult_adds) / 1e9 << " G); a training step does about 3x that (forward + backward)\n";
    o << rule << "\n";
    return o.str();
}

TF_NAMESPACE_END
