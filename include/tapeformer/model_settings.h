// The model's settings as the outside world spells them: ModelConfig's fields (nn/transformer.h, a plain
// struct) with their flags, stored keys, help and bounds in one table (settings.h), and the weights
// file's metadata read and written through it. Above nn: the numeric core knows only the struct.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tapeformer/nn/transformer.h"
#include "tapeformer/settings.h"

TF_NAMESPACE_BEGIN

// Every setting of ModelConfig with its name, bounds and help: the one table that the train command's
// flags, run.json (under "model.", train_settings.h) and the weights file's metadata are read and written
// through. Its bounds are ModelConfig's own (kMaxDModel, ...).
const std::vector<Setting<ModelConfig>>& model_settings();

// As strings, for the safetensors header's __metadata__ ("d_model" -> "32"), and back (unknown keys are
// ignored, missing ones keep their defaults, malformed or out-of-range values throw std::invalid_argument
// naming the key and the value).
std::map<std::string, std::string> to_metadata(const ModelConfig& c);
ModelConfig model_config_from_metadata(const std::map<std::string, std::string>& metadata);

// The parts of the paper's model that `c` switches off, as the flags that do it ("--no-causal-mask",
// "--positional none"), in the table's order; empty for the paper's model. For headers that say which
// model is shown.
std::vector<std::string> switched_off_parts(const ModelConfig& c);

TF_NAMESPACE_END
