// l0_prune_heads(): a short fine-tuning loop with one log α per gated head. Each step samples every gate
// z = hard_concrete(log α) (H) and puts it, seen as (1, H, 1, 1), where the attention's gate goes; the
// attention multiplies each head's output by it (nn/attention.cpp) and backward carries ∂L/∂z into log α.
#include "tapeformer/study/heads_l0.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "tapeformer/study/ablation.h"
#include "tapeformer/study/head_formats.h"
#include "tapeformer/autograd.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/ops.h"
#include "tapeformer/optim.h"

TF_NAMESPACE_BEGIN

namespace {

struct GatedLayer {
    HeadKind kind;
    int layer;
    MultiHeadAttention* module;
    Tensor log_alpha;  // (H), a parameter
};

// BLEU and NLL per target token of the model as its gates are now.
std::pair<double, double> score(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src,
                                const std::vector<std::string>& ref, const std::vector<Example>& examples,
                                const L0Options& o) {
    const double bleu = corpus_bleu(translate_lines(model, tokenizers, src, o.decode, o.batch_tokens), ref).score;
    return {bleu, teacher_forced_loss(model, examples, o.batch_tokens, 0.0).nll};
}

std::vector<Example> encode_pairs(const std::vector<std::string>& src, const std::vector<std::string>& tgt,
                                  const TokenizerPair& tokenizers, const ModelConfig& c, const char* what) {
    ParallelText text;
    text.source = src;
    text.target = tgt;
    std::vector<Example> out = encode_parallel(text, tokenizers, std::int32_t(c.max_len - 1)).examples;
    if (out.empty())
        throw std::invalid_argument(std::string(what) + ": no pair fits the model's " + std::to_string(c.max_len) + " positions");
    return out;
}

}  // namespace

L0Report l0_prune_heads(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& train_src,
                        const std::vector<std::string>& train_tgt, const std::vector<std::string>& eval_src,
                        const std::vector<std::string>& eval_ref, const L0Options& o,
                        const std::function<void(const L0Progress&)>& on_progress) {
    if (!(o.lambda >= 0)) throw std::invalid_argument("heads prune --method l0: --lambda must be >= 0");
    if (!(o.temperature > 0)) throw std::invalid_argument("heads prune --method l0: --temperature must be > 0");
    if (!(o.stretch_low < 0 && o.stretch_high > 1))
        throw std::invalid_argument("heads prune --method l0: the stretch (l, r) must have l < 0 and r > 1");
    if (o.steps < 1) throw std::invalid_argument("heads prune --method l0: --l0-steps must be >= 1");
    if (!(o.lr >= 0) || !(o.gate_lr > 0)) throw std::invalid_argument("heads prune --method l0: --lr must be >= 0 and --gate-lr > 0");
    if (o.batch_tokens < 1) throw std::invalid_argument("heads prune --method l0: --batch-tokens must be >= 1");
    const auto [train_s, train_t] = scorable_pairs(train_src, train_tgt, "heads prune --method l0 (fine-tuning pairs)");
    const auto [src, ref] = scorable_pairs(eval_src, eval_ref, "heads prune --method l0 (evaluation pairs)");
    const std::vector<Example> eval_examples = encode_pairs(src, ref, tokenizers, model.config, "heads prune (evaluation pairs)");
    std::vector<Example> train_examples = encode_pairs(train_s, train_t, tokenizers, model.config, "heads prune (fine-tuning pairs)");

    L0Report report;
    report.options = o;
    const real beta = real(o.temperature), l = real(o.stretch_low), r = real(o.stretch_high);
    const std::vector<HeadKind> kinds = o.kinds.empty() ? std::vector<HeadKind>{HeadKind::E, HeadKind::D, HeadKind::A} : o.kinds;
    std::vector<GatedLayer> gated;
    for (HeadKind kind : {HeadKind::E, HeadKind::D, HeadKind::A}) {
        if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) continue;
        const int layers = layers_of(model.config, kind);
        for (int layer = 0; layer < layers; ++layer) {
            MultiHeadAttention& m = attention_of(model, kind, layer);
            Tensor log_alpha = Tensor::full({m.H}, real(o.init_log_alpha));  // (H)
            log_alpha.set_requires_grad(true);
            gated.push_back({kind, layer, &m, log_alpha});
        }
    }
    std::tie(report.bleu_before, report.nll_before) = score(model, tokenizers, src, ref, eval_examples, o);

    // Two Adams: the model's weights move slowly, the log α must be able to cross zero within the run.
    std::vector<Tensor> alphas;
    for (const GatedLayer& g : gated) alphas.push_back(g.log_alpha);
    Adam gate_optimizer(named_by_index(alphas));
    std::unique_ptr<Adam> model_optimizer;
    if (o.lr > 0) model_optimizer = std::make_unique<Adam>(model.parameters());
    BatcherOptions bo;
    bo.batch_tokens = o.batch_tokens;
    bo.seed = o.seed;
    const Batcher batcher(std::move(train_examples), bo);
    Rng dropout_rng(hash64(o.seed, 0xD409)), gate_rng(hash64(o.seed, 0x1A7E));

    auto evaluation_gates = [&]() {  // every gated attention's gate (1, H, 1, 1) at z = min(1, max(0, σ(log α)(r − l) + l))
        NoGradGuard no_grad;
        int closed = 0;
        for (GatedLayer& g : gated) {
            g.module->gate = reshape(hard_concrete(g.log_alpha, beta, l, r, gate_rng, false), {1, g.module->H, 1, 1}).clone();
            for (std::int64_t h = 0; h < g.module->H; ++h) closed += g.module->gate.data()[h] == 0;
        }
        return closed;
    };

    std::int64_t epoch = 0;
    std::vector<std::vector<std::int64_t>> plan = batcher.epoch_plan(epoch);
    std::size_t next = 0;
    for (int step = 1; step <= o.steps; ++step) {
        if (next == plan.size()) {
            plan = batcher.epoch_plan(++epoch);
            next = 0;
        }
        const Batch b = batcher.batch(plan[next++]);
        gate_optimizer.zero_grad();
        if (model_optimizer) model_optimizer->zero_grad();
        Tensor penalty = Tensor::scalar(0);  // Σ_h P(z_h ≠ 0), shape ()
        for (GatedLayer& g : gated) {
            g.module->gate = reshape(hard_concrete(g.log_alpha, beta, l, r, gate_rng), {1, g.module->H, 1, 1});  // z (1, H, 1, 1)
            penalty = add(penalty, sum_all(hard_concrete_open(g.log_alpha, beta, l, r)));
        }
        Pass pass{&dropout_rng};
        Tensor logits = model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);  // (B, T, V)
        LossReport lr;
        Tensor nll = sequence_loss(logits, b.target, model.config.pad_id, 0, &lr);  // mean per target token
        Tensor loss = add(nll, scale(penalty, real(o.lambda)));
        backward(loss);
        gate_optimizer.step(o.gate_lr);
        if (model_optimizer) model_optimizer->step(o.lr);
        if (step % std::max(o.log_every, 1) == 0 || step == o.steps) {
            L0Progress p;
            p.step = step;
            p.nll = lr.nll;
            p.expected_open = double(penalty.item());
            p.closed = evaluation_gates();
            report.progress.push_back(p);
            if (on_progress) on_progress(p);
        }
    }
    report.closed = evaluation_gates();
    {
        NoGradGuard no_grad;
        for (const GatedLayer& g : gated) {
            const Tensor open = hard_concrete_open(g.log_alpha, beta, l, r);  // (H)
            for (std::int64_t h = 0; h < g.module->H; ++h)
                report.heads.push_back({HeadId{g.kind, g.layer, int(h)}, double(g.log_alpha.data()[h]), double(open.data()[h]),
                                        double(g.module->gate.data()[h])});
        }
    }
    std::tie(report.bleu_after, report.nll_after) = score(model, tokenizers, src, ref, eval_examples, o);
    return report;
}

std::string l0_json(const L0Report& r) {
    nlohmann::json heads = nlohmann::json::array(), closed = nlohmann::json::array(), progress = nlohmann::json::array();
    for (const L0Head& h : r.heads) {
        heads.push_back({{"head", h.id.str()}, {"log_alpha", h.log_alpha}, {"p_open", h.p_open}, {"gate", h.gate},
                         {"closed", h.closed()}});
        if (h.closed()) closed.push_back(h.id.str());
    }
    for (const L0Progress& p : r.progress)
        progress.push_back({{"step", p.step}, {"nll", p.nll}, {"expected_open", p.expected_open}, {"closed", p.closed}});
    const L0Options& o = r.options;
    const nlohmann::json j = {
        {"method", "l0"},
        {"lambda", o.lambda}, {"temperature", o.temperature}, {"stretch", {o.stretch_low, o.stretch_high}},
        {"init_log_alpha", o.init_log_alpha}, {"steps", o.steps}, {"lr", o.lr}, {"gate_lr", o.gate_lr}, {"seed", o.seed},
        {"gated_heads", r.heads.size()}, {"closed", r.closed}, {"closed_heads", closed},
        {"before", {{"bleu", r.bleu_before}, {"nll", r.nll_before}}},
        {"after", {{"bleu", r.bleu_after}, {"nll", r.nll_after}}},
        {"heads", heads}, {"progress", progress}};
    return j.dump(1) + "\n";
}

std::string l0_table(const L0Report& r) {
    std::ostringstream o;
    char cell[160];
    std::vector<HeadCell> gates;
    for (const L0Head& h : r.heads) {
        std::snprintf(cell, sizeof cell, "%.3f", h.gate);
        gates.push_back({h.id, h.closed() ? std::string("closed") : std::string(cell)});
    }
    for (HeadKind kind : {HeadKind::E, HeadKind::D, HeadKind::A}) {
        const std::string table = layer_head_table(kind, "evaluation gate z (closed: 0)", gates);
        if (!table.empty()) o << table << "\n";
    }
    std::snprintf(cell, sizeof cell, "%d of %zu heads closed; BLEU %.2f -> %.2f, NLL %.4f -> %.4f (before -> after fine-tuning)\n",
                  r.closed, r.heads.size(), r.bleu_before, r.bleu_after, r.nll_before, r.nll_after);
    o << cell;
    return o.str();
}

TF_NAMESPACE_END
