// The CLI's subcommands. Each add_*_command registers its flags on `app` and a callback that fills a
// config struct and calls into the library; apps/tapeformer.cpp only calls these and reports errors.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "tapeformer/config.h"
#include "tapeformer/data/tokenizer.h"

TF_NAMESPACE_BEGIN

void add_train_command(CLI::App& app);      // train: a translation model from parallel text
void add_translate_command(CLI::App& app);  // translate: text in, translations out
void add_generate_command(CLI::App& app);   // generate: a decoder-only model continues a prompt
void add_eval_command(CLI::App& app);       // eval: BLEU, chrF and reference loss of a test set
void add_encode_command(CLI::App& app);     // encode: the tokens a model sees
void add_data_command(CLI::App& app);       // data toy|copy|reverse: write a corpus
void add_gradcheck_command(CLI::App& app);  // gradcheck: every op and block against finite differences
void add_bench_command(CLI::App& app);      // bench train: training throughput vs torch_ref.py
void add_summary_command(CLI::App& app);    // summary: modules, shapes, parameters, multiply-adds
void add_heads_command(CLI::App& app);      // heads: per-head importance, gradient norms, attention statistics
void add_attention_command(CLI::App& app);  // attention: one sentence's maps as JSON, HTML and SVG
void add_explain_command(CLI::App& app);    // explain: one sentence through the model, stage by stage
void add_tape_command(CLI::App& app);       // tape: the records of one training step, backward order, DOT
void add_average_command(CLI::App& app);    // average: the mean of a run's last checkpoints
void add_report_command(CLI::App& app);     // report: the training run as one self-contained HTML page
void add_exercise_command(CLI::App& app);   // exercise list|start|check: graded exercises

// A flag check: the value is a number > lo (strict) or >= lo; the error says so ("--beam: must be > 0, got 0").
CLI::Validator number_above(double lo, bool strict);
// Throws, naming `flag`, if the output `path` cannot be written by io.h's rule (a directory, a block device,
// a socket, a missing directory) or would replace one of `inputs`: a file the command reads (compared by
// device and inode, after following links), or, for a directory among them (a model or run directory), a
// file training wrote there (train.h: is_run_file). "-" (standard output) passes. Called before any work,
// so that a wrong output is refused before hours of decoding, not after, and before anything is replaced.
void check_output_path(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs = {});
// A directory a command writes a model into (average --out, heads prune --save): new or empty, or with
// `force` one that an earlier such command wrote (a model.safetensors and no run.json: never a training
// run's); none of the files written there (model.safetensors, the tokenizer's of either layout) may be one of
// `inputs` (check_output_path; a checkpoint DIR/checkpoints/step-N.safetensors among them brings DIR).
// `made_by` names what is written in the errors ("average", "pruned model").
void check_model_out_dir(const std::string& dir, const std::string& flag, const std::string& made_by, bool force,
                         std::vector<std::string> inputs);
struct DecodeOptions;
// translate's and eval's decoding flags (--beam, --length-penalty, --max-len, --max-len-ratio, ...).
void add_decode_options(CLI::App& cmd, DecodeOptions& options, std::int64_t& batch_tokens);
// A progress callback (done, total) redrawing one line on stderr when it is a terminal; empty otherwise.
std::function<void(std::int64_t, std::int64_t)> terminal_progress(const std::string& what);

// Adds to every integer flag of `app` and its subcommands a check that the value fits its type: CLI11 alone
// saturates an overflowing value and wraps a negative one for an unsigned flag. Call after adding them all.
// (train's flags are checked by its settings table instead.)
void check_integer_flags(CLI::App& app);
// Throws std::invalid_argument naming the first word of argv that stands where a subcommand of `app` (or
// of the subcommand before it) should be and is none, with the closest name when one is near.
void check_subcommand_name(const CLI::App& app, int argc, const char* const* argv);
// --precision fp32|bf16|int8 (translate, eval, bench train; train has it in its settings table), and setting it
// for the process: bf16 on a CPU without bf16 instructions prints one note on stderr and runs fp32.
CLI::Option* add_precision_option(CLI::App& cmd, std::string& precision);
void apply_precision(const std::string& precision);
// set_threads(n) for the flag `flag` (n <= 0: all cores). OpenBLAS caps the count, OpenMP's with it, at the
// number it was built for: a larger n is refused with that number rather than run with fewer threads.
void apply_threads(int n, const std::string& flag);

// A word tokenizer knowing the words of `sentence` and `tgt` (either may be empty), both sides one table:
// the vocabulary of an untrained model made for one sentence (explain --init, tape without --model).
TokenizerPair sentence_vocabulary(const std::string& sentence, const std::string& tgt);

struct ModelConfig;
// The parts of the model an untrained one (--init) can be built without, from the settings table: a
// --no-NAME flag for each switch that is on by default, and --positional. Sets them in `config`; returns
// the flags' names, for commands that allow them with --init only.
std::vector<std::string> add_model_switch_flags(CLI::App& cmd, ModelConfig& config, const std::string& help_suffix);

class Transformer;
// --mask-heads KIND:layer:head,... (translate, eval, attention, heads): heads whose gate is set to 0.
CLI::Option* add_mask_heads_option(CLI::App& cmd, std::string& heads);
// Sets the gate of every head `heads` names (heads.h: parse_head_list, mask_heads) to 0 in the loaded `model`;
// nothing when `heads` is empty. A malformed list or a head the model lacks throws parse_head_list's error.
void apply_mask_heads(Transformer& model, const std::string& heads);

// Exit status a command's callback wants main to return (0 = success). Set by callbacks.
int& command_exit_code();
// Keeps the reason of std::cout's first failed write, for finish_standard_output; main calls it first.
void watch_standard_output();
// Flushes standard output and throws std::runtime_error ("cannot write to standard output: No space left on
// device") if anything printed there was lost: main calls it after every command, so a full disk or a
// closed pipe (main ignores SIGPIPE, so that a write reports EPIPE) never ends with exit status 0.
void finish_standard_output();

TF_NAMESPACE_END
