// Encoding, padding and length-bucketed batching. The random order of an epoch comes from tapeformer's
// counter-based generator (random.h; not std:: distributions, whose output differs between standard
// libraries), seeded from (seed, epoch), so the same data position always means the same batch.
#include "tapeformer/data/batch.h"

#include "tapeformer/random.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <tuple>

TF_NAMESPACE_BEGIN

namespace {

// The random stream of one epoch: its seed is a hash of (seed, epoch), so any epoch can be replayed alone.
Rng epoch_rng(std::uint64_t seed, std::int64_t epoch) { return Rng(hash64(seed, static_cast<std::uint64_t>(epoch))); }

// Fisher–Yates: for i from the end, swap v[i] with a uniformly chosen v[j], j <= i.
template <class T>
void shuffle(std::vector<T>& v, Rng& rng) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// Padded positions of each side: tokens + EOS on the source, BOS + tokens (or tokens + EOS) on the target.
std::int64_t src_positions(const Example& e) { return static_cast<std::int64_t>(e.src.size()) + 1; }
std::int64_t tgt_positions(const Example& e) { return static_cast<std::int64_t>(e.tgt.size()) + 1; }

// Cuts `order` into consecutive groups, closing a group when adding the next item would break the budget:
// (B + 1) * max(longest so far, next) > batch_tokens, or B would exceed max_sentences.
// `positions(i)` is the padded length an item needs; a group always gets at least one item.
template <class Positions>
std::vector<std::vector<std::int64_t>> cut_greedy(const std::vector<std::int64_t>& order, std::int64_t batch_tokens,
                                                  std::int64_t max_sentences, Positions positions) {
    std::vector<std::vector<std::int64_t>> batches;
    std::vector<std::int64_t> current;
    std::int64_t longest = 0;
    for (std::int64_t i : order) {
        std::int64_t need = std::max(longest, positions(i));
        std::int64_t rows = static_cast<std::int64_t>(current.size()) + 1;
        bool fits = rows * need <= batch_tokens && (max_sentences <= 0 || rows <= max_sentences);
        if (!fits && !current.empty()) {
            batches.push_back(std::move(current));
            current.clear();
            need = positions(i);
        }
        current.push_back(i);
        longest = need;
    }
    if (!current.empty()) batches.push_back(std::move(current));
    return batches;
}

}  // namespace

EncodedCorpus encode_parallel(const ParallelText& text, const TokenizerPair& tokenizers, std::int32_t max_len) {
    EncodedCorpus corpus;
    corpus.stats = text.stats;
    corpus.examples.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        Example e{tokenizers.source->encode(text.source[i]), tokenizers.target->encode(text.target[i]),
                  i < text.line.size() ? text.line[i] : 0};
        std::size_t limit = static_cast<std::size_t>(max_len);
        if (max_len > 0 && (e.src.size() > limit || e.tgt.size() > limit)) {
            ++corpus.stats.too_long;
            continue;
        }
        corpus.examples.push_back(std::move(e));
    }
    return corpus;
}

std::vector<std::vector<std::int32_t>> encode_lines(const std::vector<std::string>& lines,
                                                    const Tokenizer& tokenizer) {
    std::vector<std::vector<std::int32_t>> out;
    out.reserve(lines.size());
    for (const std::string& line : lines) out.push_back(tokenizer.encode(line));
    return out;
}

namespace {

// Fills the source side of `b` from B token rows: src (B, S) = tokens + EOS, right-padded.
template <class Rows>
void fill_source(Batch& b, std::int32_t B, Rows rows) {
    b.B = B;
    for (std::int32_t r = 0; r < B; ++r) b.S = std::max(b.S, static_cast<std::int32_t>(rows(r).size()) + 1);
    b.src.assign(static_cast<std::size_t>(B) * b.S, kPadId);  // (B, S)
    for (std::int32_t r = 0; r < B; ++r) {
        const std::vector<std::int32_t>& tokens = rows(r);
        std::int32_t* row = b.src.data() + static_cast<std::size_t>(r) * b.S;
        std::copy(tokens.begin(), tokens.end(), row);
        row[tokens.size()] = kEosId;
        b.src_len.push_back(static_cast<std::int32_t>(tokens.size()) + 1);
        b.num_src_tokens += b.src_len.back();
    }
}

}  // namespace

Batch make_source_batch(const std::vector<std::vector<std::int32_t>>& sources,
                        const std::vector<std::int64_t>& indices) {
    Batch b;
    fill_source(b, static_cast<std::int32_t>(indices.size()),
                [&](std::int32_t r) -> const std::vector<std::int32_t>& { return sources.at(indices[r]); });
    b.index = indices;
    return b;
}

Batch make_batch(const std::vector<Example>& examples, const std::vector<std::int64_t>& indices) {
    Batch b;
    fill_source(b, static_cast<std::int32_t>(indices.size()),
                [&](std::int32_t r) -> const std::vector<std::int32_t>& { return examples.at(indices[r]).src; });
    b.index = indices;
    // dec_in (B, T) = BOS + tokens and target (B, T) = tokens + EOS: position t of dec_in predicts
    // position t of target, the teacher-forcing shift.
    for (std::int64_t i : indices) b.T = std::max(b.T, static_cast<std::int32_t>(examples[i].tgt.size()) + 1);
    b.dec_in.assign(static_cast<std::size_t>(b.B) * b.T, kPadId);  // (B, T)
    b.target.assign(static_cast<std::size_t>(b.B) * b.T, kPadId);  // (B, T)
    for (std::int32_t r = 0; r < b.B; ++r) {
        const std::vector<std::int32_t>& t = examples[indices[r]].tgt;
        std::int32_t* in = b.dec_in.data() + static_cast<std::size_t>(r) * b.T;
        std::int32_t* out = b.target.data() + static_cast<std::size_t>(r) * b.T;
        in[0] = kBosId;
        std::copy(t.begin(), t.end(), in + 1);
        std::copy(t.begin(), t.end(), out);
        out[t.size()] = kEosId;
        b.tgt_len.push_back(static_cast<std::int32_t>(t.size()) + 1);
        b.num_tgt_tokens += b.tgt_len.back();
    }
    return b;
}

Batcher::Batcher(std::vector<Example> examples, const BatcherOptions& options)
    : examples_(std::move(examples)), options_(options) {
    if (options_.batch_tokens <= 0)
        throw std::invalid_argument("batch_tokens must be positive, got " + std::to_string(options_.batch_tokens));
    for (std::size_t i = 0; i < examples_.size(); ++i) {
        std::int64_t need = std::max(src_positions(examples_[i]), tgt_positions(examples_[i]));
        if (need > options_.batch_tokens && !options_.oversize_alone)
            throw std::invalid_argument(
                "example " + std::to_string(i) + " has " + std::to_string(examples_[i].src.size()) + " source and " +
                std::to_string(examples_[i].tgt.size()) + " target tokens and needs " + std::to_string(need) +
                " positions, more than batch_tokens " + std::to_string(options_.batch_tokens) +
                ": raise batch_tokens or lower max_len");
    }
    num_batches_ = static_cast<std::int64_t>(epoch_plan(0).size());
}

std::vector<std::vector<std::int64_t>> Batcher::cut(const std::vector<std::int64_t>& sorted) const {
    return cut_greedy(sorted, options_.batch_tokens, options_.max_sentences, [&](std::int64_t i) {
        return std::max(src_positions(examples_[i]), tgt_positions(examples_[i]));
    });
}

std::vector<std::vector<std::int64_t>> Batcher::epoch_plan(std::int64_t epoch) const {
    Rng rng = epoch_rng(options_.seed, epoch);
    std::vector<std::int64_t> order(examples_.size());
    std::iota(order.begin(), order.end(), 0);
    if (options_.shuffle) shuffle(order, rng);  // random order among equal lengths
    // Sort by what the budget counts, max(S, T), then by T and S: on Multi30k (BPE 8000, 4096 tokens) this
    // pads 4% of target and 4% of source positions, where sorting by (T, S) pads 0.5% and 12% and needs
    // 9% more batches.
    auto key = [&](std::int64_t i) {
        const Example& e = examples_[i];
        return std::make_tuple(std::max(e.src.size(), e.tgt.size()), e.tgt.size(), e.src.size());
    };
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return key(a) < key(b); });
    std::vector<std::vector<std::int64_t>> batches = cut(order);
    if (options_.shuffle) shuffle(batches, rng);
    return batches;
}

std::vector<Batch> Batcher::epoch_batches(std::int64_t epoch) const {
    std::vector<Batch> batches;
    for (const std::vector<std::int64_t>& indices : epoch_plan(epoch)) batches.push_back(batch(indices));
    return batches;
}

std::vector<Batch> inference_batches(const std::vector<std::vector<std::int32_t>>& sources,
                                     std::int64_t batch_tokens, std::int64_t max_sentences) {
    if (batch_tokens <= 0)
        throw std::invalid_argument("batch_tokens must be positive, got " + std::to_string(batch_tokens));
    std::vector<std::int64_t> order(sources.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return sources[a].size() < sources[b].size(); });
    std::vector<Batch> batches;
    for (const auto& indices : cut_greedy(order, batch_tokens, max_sentences, [&](std::int64_t i) {
             return static_cast<std::int64_t>(sources[i].size()) + 1;
         }))
        batches.push_back(make_source_batch(sources, indices));
    return batches;
}

TF_NAMESPACE_END
