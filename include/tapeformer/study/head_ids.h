// Naming heads and switching them off: KIND:layer:head, 0-based, with E = encoder self-attention, D =
// decoder self-attention, A = encoder–decoder (cross) attention; a head is masked by setting its gate ξ_h
// (nn/attention.h) to 0.
#pragma once
#include <string>
#include <vector>

#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

enum class HeadKind { E, D, A };

// The three kinds, in the order every table lists them.
inline constexpr HeadKind kHeadKinds[] = {HeadKind::E, HeadKind::D, HeadKind::A};
// The layers of `config`'s model that have an attention of `kind`.
int layers_of(const ModelConfig& config, HeadKind kind);
// The heads of that kind's attention in `layer`: config.heads, unless heads were removed (ModelConfig::heads_in).
int heads_of(const ModelConfig& config, HeadKind kind, int layer);

struct HeadId {
    HeadKind kind = HeadKind::E;
    int layer = 0, head = 0;
    std::string str() const;  // "E:0:1"
    bool operator==(const HeadId& o) const { return kind == o.kind && layer == o.layer && head == o.head; }
};

char to_char(HeadKind kind);             // 'E', 'D', 'A'
const char* describe(HeadKind kind);     // "encoder self-attention", ...

// "E:0:1,A:2:3" -> heads. Throws std::invalid_argument naming the item and what is wrong (a malformed
// spec, or a kind, layer or head that `config`'s model lacks).
std::vector<HeadId> parse_head_list(const std::string& spec, const ModelConfig& config);

// "E,A" -> kinds. Throws std::invalid_argument naming the item when it is not E, D or A.
std::vector<HeadKind> parse_head_kinds(const std::string& spec);

// The attention module of a kind and layer.
MultiHeadAttention& attention_of(Transformer& model, HeadKind kind, int layer);
const MultiHeadAttention& attention_of(const Transformer& model, HeadKind kind, int layer);

// Sets each listed head's gate to 0 (and every other gate to 1). Masking every head of a layer leaves
// that attention's output equal to its out-projection bias: the layer then passes no information
// between positions, which is a valid (if drastic) experiment, not an error.
void mask_heads(Transformer& model, const std::vector<HeadId>& heads);

// The heads whose gate is 0 now (--mask-heads, or mask_heads above), in E, D, A and layer order.
std::vector<HeadId> masked_heads(Transformer& model);

TF_NAMESPACE_END
