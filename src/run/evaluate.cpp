// Translating text with a trained model, and scoring it.
#include "tapeformer/run/evaluate.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/data/text.h"

TF_NAMESPACE_BEGIN

std::vector<std::optional<std::string>> translate_lines_until(Transformer& model, const TokenizerPair& tokenizers,
                                                              const std::vector<std::string>& lines,
                                                              const DecodeOptions& options, std::int64_t batch_tokens,
                                                              const ProgressFn& progress,
                                                              const std::function<bool()>& stop,
                                                              std::int64_t* truncated) {
    NoGradGuard no_grad;
    // The source plus EOS must fit the positional table.
    const std::size_t max_tokens = static_cast<std::size_t>(model.config.max_len - 1);
    std::vector<std::vector<std::int32_t>> sources(lines.size());
    std::int64_t cut = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
        sources[i] = tokenizers.source->encode(trim(lines[i]));
        if (sources[i].size() > max_tokens) {
            sources[i].resize(max_tokens);
            ++cut;
        }
    }
    if (truncated) *truncated = cut;
    // Beam search decodes K rows per sentence, each with its own key/value cache: the K hypotheses count
    // against the batch budget, so a batch holds about batch_tokens / K source tokens.
    const std::int64_t beams = std::max(1, options.beam);
    if (batch_tokens < beams)
        throw std::invalid_argument("translate: --beam " + std::to_string(beams) + " decodes " + std::to_string(beams) +
                                    " hypotheses per sentence, each counted against --batch-tokens " +
                                    std::to_string(batch_tokens) + ": raise --batch-tokens to at least " +
                                    std::to_string(beams) + " (better " + std::to_string(beams * 64) + ") or lower --beam");
    std::vector<std::optional<std::string>> out(lines.size());
    std::int64_t done = 0;
    const FrozenWeights frozen(model);
    for (const Batch& batch : inference_batches(sources, batch_tokens / beams)) {
        if (stop && stop()) break;
        const auto outputs = translate_batch(model, batch.src, batch.B, batch.S, options);
        for (std::int64_t b = 0; b < batch.B; ++b) {
            const std::int64_t i = batch.index[b];
            out[i] = sources[i].empty() ? std::string() : tokenizers.target->decode(outputs[b]);
        }
        done += batch.B;
        if (progress) progress(done, static_cast<std::int64_t>(lines.size()));
    }
    return out;
}

std::vector<std::string> translate_lines(Transformer& model, const TokenizerPair& tokenizers,
                                         const std::vector<std::string>& lines, const DecodeOptions& options,
                                         std::int64_t batch_tokens, const ProgressFn& progress,
                                         std::int64_t* truncated) {
    std::vector<std::string> out;
    out.reserve(lines.size());
    for (auto& line : translate_lines_until(model, tokenizers, lines, options, batch_tokens, progress, nullptr, truncated))
        out.push_back(std::move(*line));
    return out;
}

LossReport teacher_forced_loss(Transformer& model, const std::vector<Example>& examples, std::int64_t batch_tokens,
                               double label_smoothing, const ProgressFn& progress) {
    NoGradGuard no_grad;
    BatcherOptions options;
    options.batch_tokens = batch_tokens;
    options.shuffle = false;
    options.oversize_alone = true;  // --batch-tokens below the longest pair: that pair is scored alone
    Batcher batcher(examples, options);
    double loss_sum = 0, nll_sum = 0;
    std::int64_t tokens = 0, done = 0;
    for (const auto& indices : batcher.epoch_plan(0)) {
        const Batch b = batcher.batch(indices);
        LossReport r;
        Pass pass;
        pass.fuse_attention = true;  // the same numbers as the composed ops, faster
        sequence_loss(model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass), b.target, model.config.pad_id,
                      real(label_smoothing), &r);
        loss_sum += r.loss * double(r.tokens);
        nll_sum += r.nll * double(r.tokens);
        tokens += r.tokens;
        done += b.B;
        if (progress) progress(done, static_cast<std::int64_t>(examples.size()));
    }
    // No token at all would read as loss 0 and perplexity 1, a perfect model: refuse instead.
    if (tokens == 0)
        throw std::invalid_argument("teacher_forced_loss: no target token to score (" + std::to_string(examples.size()) +
                                    " examples)");
    LossReport total;
    total.tokens = tokens;
    total.loss = tokens ? loss_sum / double(tokens) : 0.0;
    total.nll = tokens ? nll_sum / double(tokens) : 0.0;
    total.ppl = std::exp(total.nll);
    return total;
}

std::vector<ExampleNll> per_example_nll(Transformer& model, const std::vector<Example>& examples,
                                        std::int64_t batch_tokens) {
    NoGradGuard no_grad;
    BatcherOptions options;
    options.batch_tokens = batch_tokens;
    options.shuffle = false;
    options.oversize_alone = true;
    Batcher batcher(examples, options);
    std::vector<ExampleNll> out(examples.size());
    for (const auto& indices : batcher.epoch_plan(0)) {
        const Batch b = batcher.batch(indices);
        Pass pass;
        pass.fuse_attention = true;
        const Tensor logits = model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);  // (B, T, V)
        const std::int64_t V = logits.shape().last();
        const real* z = logits.data();
        for (std::int64_t r = 0; r < std::int64_t(b.B) * b.T; ++r) {
            const std::int32_t target = b.target[std::size_t(r)];
            if (target == model.config.pad_id) continue;
            // −log softmax(z)_target = log Σ_v exp(z_v − max) + max − z_target, in double
            const real* row = z + r * V;
            const double top = *std::max_element(row, row + V);
            double sum = 0;
            for (std::int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
            ExampleNll& e = out[std::size_t(b.index[std::size_t(r / b.T)])];
            e.nll_sum += std::log(sum) + top - double(row[target]);
            e.tokens += 1;
        }
    }
    return out;
}

EvalReport evaluate(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src_lines,
                    const std::vector<std::string>& ref_lines, const DecodeOptions& options, double label_smoothing,
                    std::int64_t batch_tokens, const ProgressFn& progress) {
    if (src_lines.size() != ref_lines.size())
        throw std::invalid_argument("evaluate: " + std::to_string(src_lines.size()) + " source lines but " +
                                    std::to_string(ref_lines.size()) + " reference lines");
    std::vector<std::string> src, ref;
    for (std::size_t i = 0; i < src_lines.size(); ++i) {
        if (trim(src_lines[i]).empty() || trim(ref_lines[i]).empty()) continue;
        src.emplace_back(trim(src_lines[i]));
        ref.emplace_back(trim(ref_lines[i]));
    }
    if (src.empty()) throw std::invalid_argument("evaluate: no non-empty sentence pairs to score");
    EvalReport report;
    report.hypotheses = translate_lines(model, tokenizers, src, options, batch_tokens, progress, &report.truncated);
    report.bleu = corpus_bleu(report.hypotheses, ref);
    report.chrf = corpus_chrf(report.hypotheses, ref);
    report.exact = exact_match(report.hypotheses, ref);
    // Teacher-forced loss of the references; pairs too long for the positional table are left out.
    ParallelText text;
    text.source = src;
    text.target = ref;
    const std::int64_t positions = model.config.max_len - 1;  // tokens of a side, without BOS/EOS
    const EncodedCorpus encoded = encode_parallel(text, tokenizers, static_cast<std::int32_t>(positions));
    report.loss_pairs = static_cast<std::int64_t>(encoded.examples.size());
    report.too_long_for_loss = encoded.stats.too_long;
    if (encoded.examples.empty())
        throw std::runtime_error("evaluate: none of the " + std::to_string(src.size()) + " pairs can be scored for loss: " +
                                 "each has more than " + std::to_string(positions) +
                                 " tokens on one side, more than the model's positional table holds");
    report.loss = teacher_forced_loss(model, encoded.examples, batch_tokens, label_smoothing);
    return report;
}

TF_NAMESPACE_END
