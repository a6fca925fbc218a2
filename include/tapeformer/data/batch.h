// From sentences to the integer batches the model reads. Sentence pairs are encoded into Examples
// (filtering over-long pairs), grouped into batches of similar length under a token budget, and
// padded into row-major (B, S) / (B, T) id arrays:
//   src    = tokens + EOS        e.g.  [ 17  9 42  2  0  0 ]
//   dec_in = BOS + tokens        e.g.  [  1 23  8  0 ]
//   target = tokens + EOS        e.g.  [ 23  8  2  0 ]      (dec_in shifted left by one)
// padded on the right with kPadId. The order of an epoch's batches is a pure function of (seed, epoch),
// so training can resume exactly from a (epoch, batch index) position.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/config.h"
#include "tapeformer/data/text.h"
#include "tapeformer/data/tokenizer.h"

TF_NAMESPACE_BEGIN

// One sentence pair as token ids, without BOS or EOS.
struct Example {
    std::vector<std::int32_t> src;
    std::vector<std::int32_t> tgt;
    std::int64_t line = 0;  // 1-based line in the files it was read from; 0 when it came from elsewhere
};

struct EncodedCorpus {
    std::vector<Example> examples;
    CorpusStats stats;  // text.stats plus the number of pairs filtered as too long
};

// Encodes every pair with tokenizers.source / tokenizers.target. Pairs with more than `max_len` tokens
// on either side (BOS/EOS not counted; 0 = no limit) are dropped and counted in stats.too_long; a model
// then needs max_len + 1 positions (tokens + EOS, or BOS + tokens).
EncodedCorpus encode_parallel(const ParallelText& text, const TokenizerPair& tokenizers, std::int32_t max_len);

// Encodes single sentences (translation input); nothing is dropped.
std::vector<std::vector<std::int32_t>> encode_lines(const std::vector<std::string>& lines,
                                                    const Tokenizer& tokenizer);

struct Batch {
    std::int32_t B = 0;               // sentences
    std::int32_t S = 0;               // padded source length (longest source + EOS)
    std::int32_t T = 0;               // padded target length (longest target + 1); 0 for inference batches
    std::vector<std::int32_t> src;    // (B, S) tokens + EOS, then kPadId
    std::vector<std::int32_t> dec_in; // (B, T) BOS + tokens, then kPadId
    std::vector<std::int32_t> target; // (B, T) tokens + EOS, then kPadId
    std::vector<std::int32_t> src_len;  // (B) real (non-pad) positions of each src row
    std::vector<std::int32_t> tgt_len;  // (B) real positions of each dec_in / target row
    std::vector<std::int64_t> index;    // (B) position of each row's example in the input list
    std::int64_t num_src_tokens = 0;    // sum of src_len
    std::int64_t num_tgt_tokens = 0;    // sum of tgt_len: the non-pad targets the loss averages over
};

// A training batch of examples[indices[0]], examples[indices[1]], ... in that row order.
Batch make_batch(const std::vector<Example>& examples, const std::vector<std::int64_t>& indices);
// A source-only batch (T = 0, dec_in and target empty) of sources[indices[b]].
Batch make_source_batch(const std::vector<std::vector<std::int32_t>>& sources,
                        const std::vector<std::int64_t>& indices);

struct BatcherOptions {
    std::int64_t batch_tokens = 4096;  // budget: B * max(S, T) <= batch_tokens, i.e. padded positions of the
                                       // larger side (S, T include EOS / BOS); the fairseq `max_tokens` rule
    std::int64_t max_sentences = 0;    // also B <= max_sentences (0 = no limit)
    bool shuffle = true;               // false: batches in length order, ties in input order (validation)
    bool oversize_alone = false;       // an example longer than batch_tokens is a batch of its own (scoring,
                                       // as translation does) instead of an error (training)
    std::uint64_t seed = 1;            // with the epoch number, fixes the epoch's order
};

// Groups examples into length-bucketed batches and orders them per epoch.
// Epoch e: shuffle the examples (seeded by (seed, e)), stable-sort by (max(S, T), T, S), the length the
// budget counts first, so equal lengths sit together in a random order, cut greedily under the budget,
// shuffle the batches.
// The cut points depend only on the sorted lengths, so every epoch has the same num_batches(), and each
// example appears in exactly one batch per epoch.
class Batcher {
public:
    // Throws std::invalid_argument if an example alone needs more than options.batch_tokens positions
    // (naming the example and what it needs: raise the budget or lower max_len).
    Batcher(std::vector<Example> examples, const BatcherOptions& options);

    std::int64_t num_examples() const { return static_cast<std::int64_t>(examples_.size()); }
    std::int64_t num_batches() const { return num_batches_; }
    const std::vector<Example>& examples() const { return examples_; }
    const BatcherOptions& options() const { return options_; }

    // The batches of `epoch`, in training order, each as the indices of its examples. Batch i of epoch e
    // is epoch_plan(e)[i] on every call: (epoch, i) is a complete data position for resuming.
    std::vector<std::vector<std::int64_t>> epoch_plan(std::int64_t epoch) const;
    Batch batch(const std::vector<std::int64_t>& indices) const { return make_batch(examples_, indices); }
    std::vector<Batch> epoch_batches(std::int64_t epoch) const;  // the padded batches of epoch_plan(epoch)

private:
    std::vector<std::vector<std::int64_t>> cut(const std::vector<std::int64_t>& sorted) const;

    std::vector<Example> examples_;
    BatcherOptions options_;
    std::int64_t num_batches_ = 0;
};

// Batches for translation: sources sorted by length (stable) and cut so that B * S <= batch_tokens and
// B <= max_sentences (0 = no limit); a source longer than the budget gets a batch of its own. Row b of a
// batch is sources[batch.index[b]], so outputs can be written back in input order.
std::vector<Batch> inference_batches(const std::vector<std::vector<std::int32_t>>& sources,
                                     std::int64_t batch_tokens, std::int64_t max_sentences = 0);

TF_NAMESPACE_END
