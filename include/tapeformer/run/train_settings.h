// Every setting of `tapeformer train` in one table (train_settings()), and what is built from it: the
// merge of preset, config file and flags into a TrainConfig, the config.toml a run writes, and run.json.
//
//   precedence:  command-line flags  >  --config FILE  >  --preset NAME  >  the defaults in train.h
//   --layers N   sets --enc-layers and --dec-layers; given with either of them in the same place
//                (the command line, one file, one preset) it is refused
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/settings.h"
#include "tapeformer/run/train.h"

TF_NAMESPACE_BEGIN

// The table: the model's settings (ModelConfig::settings(), stored under "model." in run.json) and the
// data, optimisation and run settings. Settings with a name are flags and config.toml keys; settings with
// a key are stored in run.json (the alias --layers has no key).
const std::vector<Setting<TrainConfig>>& train_settings();

// A named set of values that fills in whatever the command line and --config left unset.
struct Preset {
    std::string name, description;
    std::vector<std::pair<std::string, std::string>> values;  // setting name -> value; train-src first
    std::string make_data;  // how to get its data when it is missing ("" = it ships with tapeformer)
};
// toy, copy, reverse, multi30k ($TAPEFORMER_MULTI30K, else ../shared/data/multi30k)
std::vector<Preset> train_presets();

// What a `tapeformer train` call says, before merging.
struct TrainArguments {
    std::vector<std::pair<std::string, std::string>> flags;  // settings given as flags: name -> value
    std::string config_file;                                 // --config ("" = none)
    std::string preset;                                      // --preset ("" = none)
    std::string out_dir;
    bool resume = false, force = false, check_nan = false;
    int threads = 0;
};

struct ResolvedTrainConfig {
    TrainConfig config;
    std::vector<std::string> notes;  // for the user: settings --resume ignores, a surprising --lr
};

// Merges the sources by the precedence above and fills the defaults that follow from other settings
// (attention and activation dropout from --dropout, --total-steps from --max-steps, --lr from
// --schedule). With resume only the stopping rules and what TrainConfig::ResumeChanges lists apply; the
// rest is named in `notes`. Throws std::invalid_argument naming the flag, file:line or preset and the
// value on bad input; does not check how settings fit together (TrainConfig::validate does).
ResolvedTrainConfig resolve_train_config(const TrainArguments& args);

// Throws std::invalid_argument when a cosine or linear schedule decaying to --min-lr 0 ends before the run's
// --max-steps: every step past --total-steps would train at learning rate 0 (config.toml continued with a
// larger --max-steps, or a --resume that raises it). `resumed`: the run keeps its schedule, say so.
void check_schedule_covers_run(const TrainConfig& c, bool resumed);

// DIR/config.toml: every named setting with its value, so `train --config DIR/config.toml` repeats the run.
std::string to_toml(const TrainConfig& c);

std::string to_json(const TrainConfig& c);                    // DIR/run.json
TrainConfig train_config_from_json(const std::string& text);  // std::runtime_error when malformed

TF_NAMESPACE_END
