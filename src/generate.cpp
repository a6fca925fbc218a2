// Generation with a decoder-only model (generate.h): the token chooser (greedy, temperature, top-k, top-p)
// and the loop that feeds each chosen token back through the key/value cache.
#include "tapeformer/generate.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "tapeformer/autograd.h"
#include "tapeformer/random.h"
#include "tapeformer/settings.h"

TF_NAMESPACE_BEGIN

void GenerateOptions::validate() const {
    auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
    if (!(temperature >= 0) || !std::isfinite(temperature))
        fail("--temperature must be a finite number >= 0 (0 = greedy), got " + setting_detail::format_real(temperature));
    if (top_k < 0) fail("--top-k must be >= 0 (0 = all tokens), got " + std::to_string(top_k));
    if (!(top_p > 0 && top_p <= 1)) fail("--top-p must be in (0, 1] (1 = all tokens), got " + setting_detail::format_real(top_p));
    if (max_tokens < 0) fail("--max-tokens must be >= 0, got " + std::to_string(max_tokens));
}

namespace {
bool generable(std::int32_t v, const ModelConfig& c) { return v != c.pad_id && v != c.bos_id; }
}  // namespace

std::int32_t choose_token(const real* logits, std::int64_t V, const ModelConfig& c, const GenerateOptions& o, double u) {
    // Greedy: the largest logit, ties to the lower id.
    std::int32_t best = -1;
    for (std::int32_t v = 0; v < V; ++v)
        if (generable(v, c) && (best < 0 || logits[v] > logits[best])) best = v;
    if (best < 0) throw std::invalid_argument("generate: the vocabulary has no token but pad and BOS");
    if (o.temperature == 0 || !std::isfinite(logits[best])) return best;

    // p_v = exp((logits_v − max) / temperature) / Σ, in double.
    struct Candidate {
        double p;
        std::int32_t id;
    };
    std::vector<Candidate> cand;  // (V − 2)
    cand.reserve(static_cast<std::size_t>(V));
    const double top = logits[best];
    for (std::int32_t v = 0; v < V; ++v)
        if (generable(v, c)) cand.push_back({std::exp((double(logits[v]) - top) / o.temperature), v});
    // Most probable first, ties to the lower id: a total order, so the same logits give the same list.
    std::sort(cand.begin(), cand.end(), [](const Candidate& a, const Candidate& b) { return a.p != b.p ? a.p > b.p : a.id < b.id; });
    if (o.top_k > 0 && static_cast<std::int64_t>(cand.size()) > o.top_k) cand.resize(static_cast<std::size_t>(o.top_k));
    double total = 0;
    for (const Candidate& x : cand) total += x.p;
    if (o.top_p < 1) {  // the smallest prefix whose mass reaches top_p · total (at least one token)
        double mass = 0;
        std::size_t keep = 0;
        while (keep < cand.size() && (keep == 0 || mass < o.top_p * total)) mass += cand[keep++].p;
        cand.resize(keep);
        total = mass;
    }
    // The first candidate whose running sum passes u · total.
    const double target = u * total;
    double sum = 0;
    for (const Candidate& x : cand) {
        sum += x.p;
        if (sum > target) return x.id;
    }
    return cand.back().id;  // u · total rounded up to the full sum
}

Generation generate(Transformer& model, const std::vector<std::int32_t>& prompt, const GenerateOptions& o,
                    const std::function<void(const real*, std::int64_t)>& on_logits) {
    o.validate();
    const ModelConfig& c = model.config;
    if (!c.decoder_only())
        throw std::invalid_argument("generate: the model is an encoder-decoder (a translation model): use tapeformer translate");
    const std::int64_t positions = static_cast<std::int64_t>(prompt.size()) + 1;  // BOS + prompt
    if (positions > c.max_len)
        throw std::invalid_argument("generate: the prompt has " + std::to_string(prompt.size()) + " tokens; the model has " +
                                    std::to_string(c.max_len) + " positions, BOS included");
    NoGradGuard no_grad;
    DecoderCache cache;
    const std::int64_t V = c.tgt_vocab;
    // Feeds one token at position cache.position() -> logits (V) of the next.
    auto feed = [&](std::int32_t token) {
        const Tensor hidden = model.decode_step({token}, 1, 1, Tensor(), Tensor(), cache);  // (1, 1, C)
        return model.project(hidden).reshape({V});                                           // (1, 1, C) @ (V, C)ᵀ -> (V)
    };
    Tensor logits = feed(c.bos_id);
    for (std::int32_t t : prompt) logits = feed(t);
    Generation out;
    Rng rng(o.seed);
    while (static_cast<std::int64_t>(out.tokens.size()) < o.max_tokens) {
        if (on_logits) on_logits(logits.data(), V);
        const std::int32_t next = choose_token(logits.data(), V, c, o, rng.uniform());  // one uniform per token
        if (next == c.eos_id) {
            out.ended = true;
            break;
        }
        out.tokens.push_back(next);
        if (cache.position() >= c.max_len) break;  // no position left to feed it at
        if (static_cast<std::int64_t>(out.tokens.size()) < o.max_tokens) logits = feed(next);
    }
    return out;
}

TF_NAMESPACE_END
