// The tape view (tape_view.h): reads the records autograd.h keeps — each one's op name, input tensors and
// output — and turns them into a graph of tensors and ops. A tensor is known by its memory: a record's output,
// a parameter (or rows of one: W_q is rows [0, C) of in_proj_weight), or else a constant (the positional table).
#include "tapeformer/teach/tape_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/data/vocab.h"
#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

namespace {

double norm_of(const real* p, std::int64_t n) {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += double(p[i]) * double(p[i]);
    return std::sqrt(s);
}

std::vector<double> first_of(const real* p, std::int64_t n) {
    std::vector<double> out;
    for (std::int64_t i = 0; i < std::min<std::int64_t>(n, 4); ++i) out.push_back(p[i]);
    return out;
}


// Where the module walk lists each parameter: its deepest module and that module's layer, by parameter name
// ("encoder.layers.0.linear1.weight" -> "encoder.layers.0.ff", "encoder.layers.0").
struct Owner {
    std::string module, layer;
};
// The model's own parameters (in no part: "generator.weight") are named as summary names them, by the name
// before their last '.': "generator".
std::map<std::string, Owner> parameter_owners(const ModuleWalk& walk) {
    std::map<std::string, Owner> owners;
    for (const ModuleEntry& e : walk.modules)  // parents before their parts: the deepest module comes last
        for (std::size_t i : e.parameters) {
            const std::string& name = walk.parameters[i].name;
            owners[name] = {e.depth > 0 ? e.name : name.substr(0, name.rfind('.')), e.layer_name};
        }
    return owners;
}

// Builds the graph from the tape's records; keeps a handle to every tensor to read gradients later.
class GraphBuilder {
public:
    // params: named parameters (or an expression's variables); constants: named tensors without gradient (the
    // sinusoidal positional table); owners: the modules of the parameters (none for an expression's variables)
    GraphBuilder(TapeGraph& g, const ParamList& params, const ParamList& constants, std::map<std::string, Owner> owners)
        : g_(g), params_(params), constants_(constants), owners_(std::move(owners)) {}

    int tensor_of(const Tensor& t) {
        const Key key{t.data(), t.numel()};
        auto it = index_.find(key);
        if (it != index_.end()) return it->second;
        TapeTensor n;
        n.kind = TapeTensor::Kind::Constant;
        n.name = "constant";
        n.shape = t.shape();
        if (name_from(params_, t, n)) {
            n.kind = TapeTensor::Kind::Parameter;
            if (auto it = owners_.find(n.name.substr(0, n.name.find('['))); it != owners_.end())
                n.module = it->second.module, n.layer = it->second.layer;
        }
        else name_from(constants_, t, n);  // stays a constant, outside every module
        return add(key, n, t);
    }

    int output_of(int record, const Tensor& t, const TapeOp& op) {
        TapeTensor n;
        n.name = "#" + std::to_string(record);
        n.shape = t.shape();
        n.record = record;
        n.module = op.module, n.layer = op.layer;
        return add(Key{t.data(), t.numel()}, n, t);
    }

    // Values now; gradients when there are some.
    void summarize() {
        for (std::size_t i = 0; i < g_.tensors.size(); ++i) {
            const Tensor& t = handles_[i];
            TapeTensor& n = g_.tensors[i];
            n.value_norm = norm_of(t.data(), t.numel());
            n.first_values = first_of(t.data(), t.numel());
            const real* gr = t.grad();
            n.has_grad = gr != nullptr && g_.backward_done;
            if (n.has_grad) {
                n.grad_norm = norm_of(gr, t.numel());
                n.first_grads = first_of(gr, t.numel());
            }
        }
    }

    const Tensor& handle(int i) const { return handles_[i]; }

private:
    // Names n after the tensor of `named` whose memory holds t ("W[8:24]" for a block of its rows).
    static bool name_from(const ParamList& named, const Tensor& t, TapeTensor& n) {
        for (const NamedTensor& p : named) {
            const real* base = p.tensor.data();
            if (t.data() < base || t.data() + t.numel() > base + p.tensor.numel()) continue;
            n.name = p.name;
            if (t.numel() != p.tensor.numel()) {  // a block of rows, as Tensor::rows gives
                const std::int64_t row = p.tensor.numel() / p.tensor.size(0), first = (t.data() - base) / row;
                n.name += "[" + std::to_string(first) + ":" + std::to_string(first + t.numel() / row) + "]";
            }
            return true;
        }
        return false;
    }

    struct Key {
        const real* data;
        std::int64_t numel;
        bool operator<(const Key& o) const { return data != o.data ? data < o.data : numel < o.numel; }
    };
    int add(const Key& key, const TapeTensor& n, const Tensor& t) {
        g_.tensors.push_back(n);
        handles_.push_back(t);
        return index_[key] = int(g_.tensors.size()) - 1;
    }

    TapeGraph& g_;
    const ParamList& params_;
    const ParamList& constants_;
    const std::map<std::string, Owner> owners_;
    std::map<Key, int> index_;
    std::vector<Tensor> handles_;
};

void zero_grads(const ParamList& params) {
    for (const NamedTensor& p : params) {
        Tensor t = p.tensor;  // a handle to the same storage
        t.zero_grad();
    }
}

}  // namespace

ModelConfig tiny_tape_config(std::int64_t vocab) {
    ModelConfig c;
    c.src_vocab = c.tgt_vocab = vocab;
    c.d_model = 8;
    c.heads = 2;
    c.ffn = 16;
    c.enc_layers = c.dec_layers = 1;
    c.max_len = 64;
    return c;
}

namespace {

// Listens to the forward's probes and keeps, for each record whose output a module reported, the probe's
// name: the lessons' names of the tensors ("q", "scores", "weights", "context", "ffn_hidden", ...).
class ProbeNames : public ForwardObserver {
public:
    void probe(const void*, const char*, const char* name, const Tensor& value) override {
        const std::vector<TapeRecord>& records = tape().records();
        for (std::size_t r = records.size(); r-- > 0;)  // the latest record that made it
            if (records[r].out.data() == value.data() && records[r].out.numel() == value.numel()) {
                of_record[r] = name;
                return;
            }
    }
    std::map<std::size_t, std::string> of_record;
};

// forward + label-smoothed loss of one pair, recorded on the (cleared) tape; `names` (may be null) listens.
Tensor step_loss(Transformer& model, const std::vector<std::int32_t>& src_ids, const std::vector<std::int32_t>& tgt_ids,
                 const TapeStepOptions& options, ForwardObserver* names = nullptr) {
    const ModelConfig& c = model.config;
    if (src_ids.empty() || tgt_ids.empty()) throw std::invalid_argument("tape: the source and the target need a token each");
    std::vector<std::int32_t> src(src_ids), dec_in{c.bos_id}, target(tgt_ids);
    src.push_back(c.eos_id);                                   // (B, S) with B = 1
    dec_in.insert(dec_in.end(), tgt_ids.begin(), tgt_ids.end());  // (B, T): BOS + target
    target.push_back(c.eos_id);                                // (B, T): target + EOS
    tape().clear();
    tape().set_recording(true);
    Rng rng(options.seed);
    Pass pass;
    pass.dropout_rng = &rng;  // training: dropout on, as a training step runs (with attention's steps apart:
                              // a training step runs them as one op, attention_heads, with the same numbers)
    pass.observer = names;
    Tensor logits = model.forward(src, 1, std::int64_t(src.size()), dec_in, std::int64_t(dec_in.size()), pass);  // (B, T, V)
    return sequence_loss(logits, target, c.pad_id, real(0.1));
}

}  // namespace

TapeGraph graph_of_tape(Tensor& output, const ParamList& named, const ParamList& constants, bool run_backward,
                        const ModuleWalk* walk) {
    TapeGraph g;
    g.loss = output.item();
    GraphBuilder b(g, named, constants, walk ? parameter_owners(*walk) : std::map<std::string, Owner>{});
    const std::vector<TapeRecord>& records = tape().records();
    if (records.empty()) throw std::invalid_argument("tape: nothing was recorded (no op had an input that requires grad)");
    for (std::size_t r = 0; r < records.size(); ++r) {
        const TapeRecord& rec = records[r];
        TapeOp op;
        op.op = rec.op;
        op.has_backward = bool(rec.backward);
        int latest = -1;
        for (const Tensor& in : rec.in) {
            const int t = b.tensor_of(in);
            op.inputs.push_back(t);
            op.input_shapes.push_back(in.shape());
            const TapeTensor& n = g.tensors[t];
            if (n.kind == TapeTensor::Kind::Parameter && op.module.empty()) op.module = n.module, op.layer = n.layer;
            if (n.record > latest) latest = n.record;
        }
        if (op.module.empty() && latest >= 0)  // ops without parameters: their input's
            op.module = g.ops[latest].module, op.layer = g.ops[latest].layer;
        op.output = b.output_of(int(r), rec.out, op);
        g.ops.push_back(op);
    }
    g.tensors[g.ops.back().output].kind = TapeTensor::Kind::Loss;
    if (run_backward) {
        backward(output, /*keep_tape=*/true, [&](const TapeRecord& rec) {
            const int r = int(&rec - records.data());
            g.backward_order.push_back(r);
            std::vector<int> filled;
            std::vector<double> norms, first;
            for (std::size_t i = 0; i < rec.in.size(); ++i)
                if (rec.in[i].requires_grad()) {
                    const int t = g.ops[r].inputs[i];
                    if (std::find(filled.begin(), filled.end(), t) != filled.end()) continue;  // a*a: one tensor, listed once
                    const real* grad = static_cast<const Tensor&>(b.handle(t)).grad();
                    filled.push_back(t);
                    norms.push_back(norm_of(grad, b.handle(t).numel()));
                    first.push_back(grad[0]);
                }
            g.filled.push_back(filled);
            g.filled_norms.push_back(norms);
            g.filled_first.push_back(first);
        });
        g.backward_done = true;
    }
    b.summarize();
    tape().clear();
    return g;
}

bool every_tensor_one_number(const TapeGraph& g) {
    for (const TapeTensor& t : g.tensors)
        if (t.shape.numel() != 1) return false;
    return true;
}

TapeGraph record_training_step(Transformer& model, const std::vector<std::int32_t>& src_ids,
                               const std::vector<std::int32_t>& tgt_ids, const TapeStepOptions& options) {
    const ParamList params = unique_parameters(model.parameters());
    zero_grads(params);
    ProbeNames names;
    Tensor loss = step_loss(model, src_ids, tgt_ids, options, &names);
    ParamList constants;
    if (model.config.positional == PositionalKind::Sinusoidal) constants.push_back({"positional.table", model.positional.table});
    const ModuleWalk walk(model);
    TapeGraph g = graph_of_tape(loss, params, constants, options.backward, &walk);
    for (const auto& [record, name] : names.of_record)  // "#27" -> "scores #27"
        g.tensors[std::size_t(g.ops[record].output)].name = name + " " + g.tensors[std::size_t(g.ops[record].output)].name;
    return g;
}

std::string format_tape(const TapeGraph& g, bool step_backward) {
    std::ostringstream o;
    const bool numbers = every_tensor_one_number(g);  // write values out instead of shapes
    auto number = [](double v) { return fmt("%.6g", v); };
    auto tensor_str = [&](int t, const Shape& seen) {
        const TapeTensor& n = g.tensors[t];
        if (numbers) return n.name + " = " + number(n.first_values[0]);
        return n.name + " " + seen.str() + (seen != n.shape ? " (a view of " + n.shape.str() + ")" : "");
    };
    int out_width = 0;  // of a first graph's outputs' column, before their gradients
    for (const TapeOp& op : g.ops) out_width = std::max(out_width, int(tensor_str(op.output, g.tensors[op.output].shape).size()));
    auto output_str = [&](const TapeOp& op) {
        const TapeTensor& n = g.tensors[op.output];
        if (!numbers) return n.shape.str() + (op.module.empty() ? "" : "   [" + op.module + "]");
        const std::string value = tensor_str(op.output, n.shape);
        if (!n.has_grad) return value;
        return value + std::string(out_width - value.size(), ' ') + "   grad " + number(n.first_grads[0]);
    };
    o << "forward: " << g.ops.size() << (g.ops.size() == 1 ? " record" : " records")
      << ", in the order they were recorded (src/autograd.cpp record())\n";
    int width = 0, in_width = 0;  // of the op names' and the inputs' columns: the longest on this tape
    std::vector<std::string> inputs;
    for (const TapeOp& op : g.ops) {
        width = std::max(width, static_cast<int>(op.op.size()));
        std::string ins;
        for (std::size_t i = 0; i < op.inputs.size(); ++i) ins += (i ? ", " : "") + tensor_str(op.inputs[i], op.input_shapes[i]);
        inputs.push_back(ins);
        in_width = std::max(in_width, static_cast<int>(ins.size()));
    }
    char buf[160];
    for (std::size_t r = 0; r < g.ops.size(); ++r) {
        std::snprintf(buf, sizeof buf, "  #%-4zu %-*s  ", r, width, g.ops[r].op.c_str());
        // the arrows of a first graph line up; a model's inputs are too long for that
        const std::string ins = numbers ? inputs[r] + std::string(in_width - inputs[r].size(), ' ') : inputs[r];
        o << buf << ins << "  ->  " << output_str(g.ops[r]) << "\n";
    }
    o << g.output_label << " = " << (numbers ? number(g.loss) : fmt("%.6f", g.loss))
      << (g.output_note.empty() ? "" : " " + g.output_note) << "\n";
    if (!g.backward_done) {
        o << "\nbackward: not run\n";
        return o.str();
    }
    o << "\nbackward visits " << g.backward_order.size() << " of the " << g.ops.size()
      << " records, from the last recorded to the first (src/autograd.cpp backward()):\n  ";
    int col = 2;
    for (std::size_t i = 0; i < g.backward_order.size(); ++i) {
        const int r = g.backward_order[i];
        const std::string item = "#" + std::to_string(r) + " " + g.ops[r].op + (i + 1 < g.backward_order.size() ? ", " : "\n");
        if (col + item.size() > 100) {
            o << "\n  ";
            col = 2;
        }
        o << item;
        col += int(item.size());
    }
    if (g.backward_order.size() < g.ops.size())
        o << "  (a record is skipped when no gradient reached its output)\n";
    if (numbers) {  // the leaves' gradients: what backward was for
        o << "\ngradient of " << g.output_label << " with respect to each variable:\n";
        for (const TapeTensor& n : g.tensors)
            if (n.kind == TapeTensor::Kind::Parameter)
                o << "  d/d" << n.name << " = " << (n.has_grad ? number(n.first_grads[0]) : "0 (no path)") << "\n";
    }
    if (step_backward) {
        o << "\nbackward, record by record: the gradients each one added to (+=), "
          << (numbers ? "with their value right after\n" : "with their norm right after\n");
        for (std::size_t i = 0; i < g.backward_order.size(); ++i) {
            const int r = g.backward_order[i];
            o << "  #" << r << " " << g.ops[r].op << ":";
            if (g.filled[i].empty()) o << " nothing (no input requires grad)";
            for (std::size_t k = 0; k < g.filled[i].size(); ++k) {
                const TapeTensor& n = g.tensors[g.filled[i][k]];
                o << (k ? ", " : " ") << "grad of " << n.name
                  << (numbers ? " = " + number(g.filled_first[i][k]) : " " + n.shape.str() + " |g| = " + fmt("%.4g", g.filled_norms[i][k]));
            }
            o << "\n";
        }
    }
    return o.str();
}

namespace {

// Escapes what a Graphviz record label treats specially.
std::string escape_record(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (std::string("{}|<>\"\\").find(c) != std::string::npos) out += '\\';
        out += c;
    }
    return out;
}

// Escapes what a quoted Graphviz string treats specially.
std::string escape_quoted(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out;
}

std::string values_str(const std::vector<double>& v, std::int64_t numel) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt("%.3g", v[i]);
    return s + (std::int64_t(v.size()) < numel ? ", ...]" : "]");
}

// torchviz's colours: parameters light blue, ops light grey, saved tensors orange, the output green.
const char* fill(TapeTensor::Kind k) {
    switch (k) {
        case TapeTensor::Kind::Parameter: return "lightblue";
        case TapeTensor::Kind::Loss: return "darkolivegreen1";
        case TapeTensor::Kind::Activation: return "orange";
        default: return "white";
    }
}

}  // namespace

namespace {

// One box of a collapsed graph: what a layer or module holds, counted and listed.
struct Group {
    std::string name;                     // "encoder.layers.0", "decoder.layers.0.self_attn"
    std::map<std::string, int> op_count;  // "matmul" -> 4
    std::vector<std::string> parameters;  // their names inside the group ("self_attn.in_proj_weight[0:8]")
    int activations = 0;
};

// The box's record label, top to bottom: the name, the ops by kind, the parameters, the activations.
std::string group_label(const Group& g) {
    int ops = 0;
    std::string kinds;
    int k = 0;
    for (const auto& [op, n] : g.op_count) {
        ops += n;
        kinds += (k == 0 ? "" : k % 4 == 0 ? ",\\n" : ", ") + escape_record(op + (n > 1 ? " ×" + std::to_string(n) : ""));
        ++k;
    }
    std::string params;
    for (std::size_t i = 0; i < g.parameters.size(); ++i)
        params += (i == 0 ? "" : i % 3 == 0 ? ",\\n" : ", ") + escape_record(g.parameters[i]);
    std::string label = "{" + escape_record(g.name) + " | " + std::to_string(ops) + " op" + (ops == 1 ? "" : "s") + ": " + kinds;
    if (!g.parameters.empty())
        label += " | " + std::to_string(g.parameters.size()) + " parameter" + (g.parameters.size() == 1 ? "" : "s") + ": " + params;
    return label + " | " + std::to_string(g.activations) + " activation" + (g.activations == 1 ? "" : "s") + " saved}";
}

}  // namespace

std::string tape_dot(const TapeGraph& g, const std::string& collapse) {
    if (!collapse.empty() && collapse != "layer" && collapse != "module")
        throw std::invalid_argument("--collapse: '" + collapse + "' is not one of: layer, module");
    // With --collapse, the ops of a layer (or module) and the tensors they make are merged into that group's
    // one node, with the group's parameters. An op joins the group the walk gives it only when its parameters
    // are the group's and, without parameters, when one of its inputs is in the group: the generator's matmul
    // and the loss after the last layer stay outside it. Constants and the loss keep their own nodes.
    auto group_of = [&](const auto& x) { return collapse == "layer" ? x.layer : collapse == "module" ? x.module : ""; };
    std::vector<std::string> tensor_group(g.tensors.size()), op_group(g.ops.size());
    for (std::size_t t = 0; t < g.tensors.size(); ++t)
        if (g.tensors[t].kind == TapeTensor::Kind::Parameter) tensor_group[t] = group_of(g.tensors[t]);
    for (std::size_t r = 0; r < g.ops.size(); ++r) {  // recorded order: an op's inputs are grouped before it
        const TapeOp& op = g.ops[r];
        std::string key = group_of(op);
        bool has_parameter = false, input_inside = false;
        for (int in : op.inputs) {
            const bool parameter = g.tensors[in].kind == TapeTensor::Kind::Parameter;
            has_parameter = has_parameter || parameter;
            if (parameter && tensor_group[in] != key) key.clear();
            input_inside = input_inside || (!key.empty() && tensor_group[in] == key);
        }
        if (!has_parameter && !input_inside) key.clear();
        op_group[r] = key;
        if (g.tensors[op.output].kind != TapeTensor::Kind::Loss) tensor_group[op.output] = key;
    }
    std::map<std::string, Group> groups;
    std::vector<std::string> node_of_tensor(g.tensors.size()), node_of_op(g.ops.size());
    std::vector<std::string> nodes, edges;
    const bool numbers = every_tensor_one_number(g);  // micrograd's boxes: name | data | grad, top to bottom
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const TapeTensor& n = g.tensors[t];
        if (const std::string& key = tensor_group[t]; !key.empty()) {
            Group& group = groups[key];
            group.name = key;
            if (n.kind == TapeTensor::Kind::Parameter)
                group.parameters.push_back(n.name.rfind(key + ".", 0) == 0 ? n.name.substr(key.size() + 1) : n.name);
            else
                ++group.activations;
            node_of_tensor[t] = "g_" + key;
            continue;
        }
        node_of_tensor[t] = "t" + std::to_string(t);
        const std::int64_t numel = n.shape.numel();
        const std::string grad = !g.backward_done ? "grad: not computed"
                                 : !n.has_grad    ? "grad: none (no gradient reached it)"
                                 : numbers        ? "grad " + fmt("%.4g", n.first_grads[0])
                                                  : "grad: norm " + fmt("%.4g", n.grad_norm) + " " + values_str(n.first_grads, numel);
        const std::string data = numbers ? "data " + fmt("%.4g", n.first_values[0])
                                         : "data: norm " + fmt("%.4g", n.value_norm) + " " + values_str(n.first_values, numel);
        const std::string label = "{" + escape_record(n.name) + (numbers ? "" : " | " + escape_record(n.shape.str())) + " | " +
                                  escape_record(data) + " | " + escape_record(grad) + "}";
        nodes.push_back(node_of_tensor[t] + " [shape=record, style=filled, fillcolor=" + fill(n.kind) + ", label=\"" +
                        label + "\"];");
    }
    for (std::size_t r = 0; r < g.ops.size(); ++r) {
        const TapeOp& op = g.ops[r];
        if (const std::string& key = op_group[r]; !key.empty()) {
            Group& group = groups[key];
            group.name = key;
            ++group.op_count[op.op];
            node_of_op[r] = "g_" + key;
            continue;
        }
        node_of_op[r] = "op" + std::to_string(r);
        nodes.push_back(node_of_op[r] + " [shape=ellipse, style=filled, fillcolor=lightgrey, label=\"#" + std::to_string(r) +
                        " " + op.op + "\"];");
    }
    // A group's node ids are its name in quotes; an edge inside a group disappears, and each edge between
    // two nodes is drawn once.
    auto id = [](const std::string& node) { return node.rfind("g_", 0) == 0 ? "\"" + escape_quoted(node) + "\"" : node; };
    std::set<std::pair<std::string, std::string>> drawn;
    auto edge = [&](const std::string& from, const std::string& to) {
        if (from != to && drawn.insert({from, to}).second) edges.push_back(id(from) + " -> " + id(to) + ";");
    };
    for (std::size_t r = 0; r < g.ops.size(); ++r) {
        for (int in : g.ops[r].inputs) edge(node_of_tensor[in], node_of_op[r]);
        edge(node_of_op[r], node_of_tensor[g.ops[r].output]);
    }
    for (const auto& [key, group] : groups)
        nodes.push_back(id("g_" + key) + " [shape=record, style=\"filled,rounded\", fillcolor=lightyellow, label=\"" +
                        group_label(group) + "\"];");
    std::ostringstream o;
    o << "digraph tape {\n"
      << "  rankdir=TB;\n"  // top to bottom: a step's ops follow each other down a page
      << (numbers ? "  ranksep=0.25;\n  nodesep=0.3;\n"  // a first graph: one slide
                  : "  size=\"11.7,16.5\";\n")  // at most A3 portrait (inches): Graphviz scales a larger drawing down
      << "  fontname=\"Helvetica\";\n"
      << "  node [fontname=\"Helvetica\", fontsize=10];\n"
      << "  label=\"" << escape_quoted(g.title)
      << (numbers ? "\\nblue: variables, orange: intermediate values, green: the result, white: constants\";\n"
                  : ": tensors (blue parameters, orange activations saved on the tape, green loss, white "
                    "constants) and the ops that made them, in recorded order" +
                        std::string(collapse.empty() ? "" : "; yellow: one " + collapse + " each, its ops and tensors inside") +
                        "\";\n");
    for (const auto& n : nodes) o << "  " << n << "\n";
    for (const auto& e : edges) o << "  " << e << "\n";
    o << "}\n";
    return o.str();
}

std::string backward_twice_report(Transformer& model, const std::vector<std::int32_t>& src_ids,
                                  const std::vector<std::int32_t>& tgt_ids, const TapeStepOptions& options) {
    const ParamList params = unique_parameters(model.parameters());
    zero_grads(params);
    auto norms = [&]() {
        std::vector<double> out;
        for (const NamedTensor& p : params) out.push_back(p.tensor.has_grad() ? norm_of(static_cast<const Tensor&>(p.tensor).grad(), p.tensor.numel()) : 0);
        return out;
    };
    Tensor loss = step_loss(model, src_ids, tgt_ids, options);
    backward(loss);
    const std::vector<double> first = norms();
    loss = step_loss(model, src_ids, tgt_ids, options);  // the same step again (same dropout masks), no zero_grad
    backward(loss);
    const std::vector<double> second = norms();
    std::ostringstream o;
    o << "the same step's forward and backward twice, without zero_grad() in between:\n";
    char buf[256];
    std::snprintf(buf, sizeof buf, "  %-48s %14s %14s %8s\n", "parameter", "|grad| after 1", "|grad| after 2", "ratio");
    o << buf;
    double worst = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
        const double ratio = first[i] > 0 ? second[i] / first[i] : 0;
        if (first[i] > 0) worst = std::max(worst, std::abs(ratio - 2));
        std::snprintf(buf, sizeof buf, "  %-48s %14.6g %14.6g %8s\n", params[i].name.c_str(), first[i], second[i],
                      first[i] > 0 ? fmt("%.4f", ratio).c_str() : "-");
        o << buf;
    }
    o << (worst < 1e-4 ? "every gradient doubled" : "NOT every gradient doubled")
      << ": backward adds (+=) into a gradient that holds one (only the first contribution after zero_grad() is "
         "written, over zeros) — which is why a training step calls zero_grad() before its backward (src/run/train_step.cpp)\n";
    zero_grads(params);
    return o.str();
}

TF_NAMESPACE_END
