// Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one run (fairseq's
// scripts/average_checkpoints.py, Marian's checkpoint averaging). Late in training the weights wander around
// a minimum; their mean usually translates better than any one of them.
#pragma once
#include <string>
#include <vector>

#include "tapeformer/run/checkpoint.h"

TF_NAMESPACE_BEGIN

// The mean of the models in `paths` (checkpoints DIR/checkpoints/step-N.safetensors or model directories,
// as load_model_dir reads them), accumulated in double. They must share the model's configuration and
// tokenizer, and be of one run: the same run id (RunStamp), or, for files written before run ids, the same
// run directory. Files of different runs only with `mix_runs` (the CLI's --mix-runs); the same weights
// twice (one file under two names, or one run's step twice: a copy, or DIR and its checkpoint of the
// step model.safetensors holds) never, since they would count twice. Each problem is a std::runtime_error
// naming the paths. The mean's stamp: the run's id (none when runs were mixed), no step.
// `paths` must not be empty.
ModelBundle average_models(const std::vector<std::string>& paths, bool mix_runs = false);

// The `last` newest checkpoints of the run in `dir` (kept ones included), oldest first, as paths. Throws
// when the run holds fewer than `last`, saying how many it has.
std::vector<std::string> newest_checkpoints(const std::string& dir, int last);

TF_NAMESPACE_END
