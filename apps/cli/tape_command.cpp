// `tapeformer tape`: the tape of one training step (tape_view.h) — the records in order, the order backward
// visits them, optionally what each backward record filled, the graph as Graphviz DOT, and the lesson that
// gradients accumulate. With --expr, the same for a first graph of a few numbers (expression.h).
#include <iostream>
#include <memory>
#include <stdexcept>

#include "tapeformer/run/checkpoint.h"
#include "cli/commands.h"
#include "tapeformer/data/text.h"
#include "tapeformer/io.h"
#include "tapeformer/teach/expression.h"
#include "tapeformer/teach/tape_view.h"

TF_NAMESPACE_BEGIN

namespace {

struct TapeCommandOptions {
    std::string model_dir, src = "a b c", tgt = "c b a", dot, collapse, expr, set;
    bool step_backward = false, backward_twice = false, forward_only = false;
    std::int64_t d_model = 8, heads = 2, ffn = 16, layers = 1;
    std::uint64_t seed = 1;
};

std::vector<std::int32_t> ids_of(const Tokenizer& t, const std::string& text, const char* flag) {
    const std::string line(trim(text));
    if (line.empty()) throw std::runtime_error(std::string(flag) + ": the sentence is empty");
    return t.encode(line);
}

// --expr: the first graph. Errors name the flag they come from: "tape --expr: unexpected ')' at column 7".
void run_expression(const TapeCommandOptions& opt) {
    Expr e;
    Assignments values;
    try {
        e = parse_expression(opt.expr);
    } catch (const std::invalid_argument& err) {
        throw std::runtime_error(std::string("tape --expr: ") + err.what());
    }
    try {
        values = opt.set.empty() ? Assignments{} : parse_assignments(opt.set);
        check_assignments(e, values);
    } catch (const std::invalid_argument& err) {
        throw std::runtime_error(std::string("tape --set: ") + err.what());
    }
    TapeGraph g;
    try {
        g = record_expression(e, values, !opt.forward_only);
    } catch (const std::invalid_argument& err) {
        throw std::runtime_error(std::string("tape --expr: ") + err.what());
    }
    std::cout << "tape: " << g.title << ", each number a one-element tensor, through the ops and the tape a Transformer uses\n\n"
              << format_tape(g, opt.step_backward);
    if (!opt.dot.empty()) {
        write_file_atomic(opt.dot, tape_dot(g, ""));
        std::cout << "\nwrote " << opt.dot << " (" << g.tensors.size() << " values, " << g.ops.size()
                  << " ops; render: dot -Tsvg " << opt.dot << " -o graph.svg)\n";
    }
}

}  // namespace

void add_tape_command(CLI::App& app) {
    auto opt = std::make_shared<TapeCommandOptions>();
    CLI::App* cmd = app.add_subcommand(
        "tape",
        "Record one training step (forward with dropout, label-smoothed loss) of a tiny model — 1+1 layers, C 8,\n"
        "2 heads, a word vocabulary of the two sentences — or of --model DIR, and print the tape: every record's\n"
        "op, inputs and output shape in the order recorded, then the order backward visits them.\n"
        "With --expr, a first graph instead: an expression of a few numbers (micrograd's size) through the same\n"
        "ops and tape, each record printed with its value and gradient.\n"
        "Examples: tapeformer tape\n"
        "          tapeformer tape --dot tape.dot --collapse layer && dot -Tsvg tape.dot -o tape.svg\n"
        "          tapeformer tape --step-backward --backward-twice\n"
        "          tapeformer tape --expr \"tanh(a*b + c)\" --set a=2,b=-3,c=10 --step-backward --dot graph.dot");
    cmd->add_option("--expr", opt->expr,
                    "A first graph instead of a model: an expression of numbers and variables with + - * /,\n"
                    "^ (a constant exponent), unary minus, parentheses and tanh, sigmoid, exp, log, relu,\n"
                    "e.g. \"tanh(a*b + c)\"; each variable needs a value from --set. Goes with --set, --dot,\n"
                    "--step-backward and --forward-only only; the DOT shows each value and gradient");
    cmd->add_option("--set", opt->set, "With --expr: the variables' values, name=value separated by commas: a=2,b=-3,c=10");
    cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train` instead of the tiny model");
    cmd->add_option("--src", opt->src, "The source sentence of the step")->capture_default_str();
    cmd->add_option("--tgt", opt->tgt, "The target sentence of the step")->capture_default_str();
    cmd->add_option("--dot", opt->dot,
                    "Write the graph as Graphviz DOT here: a node per tensor (name, shape, data norm and first values,\n"
                    "gradient norm and first values or \"grad: not computed\") and per op; parameters light blue, ops\n"
                    "grey, activations saved on the tape orange, the loss green, constants white");
    cmd->add_option("--collapse", opt->collapse, "With --dot: one node per layer or per module, listing its ops, parameters and\n"
                    "saved activations (a Transformer step on one page)")
        ->check(CLI::IsMember({"layer", "module"}));
    cmd->add_flag("--forward-only", opt->forward_only, "Record the forward pass only: no backward, the DOT says \"grad: not computed\"");
    cmd->add_flag("--step-backward", opt->step_backward,
                  "After each backward record, print which gradients it added to and their norm at that moment");
    cmd->add_flag("--backward-twice", opt->backward_twice,
                  "Then run the step's forward and backward twice without zero_grad: every gradient doubles (+=)");
    cmd->add_option("--d-model", opt->d_model, "Model width C of the tiny model")->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--heads", opt->heads, "Attention heads H of the tiny model")->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--ffn", opt->ffn, "FFN inner width F of the tiny model")->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--layers", opt->layers, "Encoder and decoder layers of the tiny model")->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--seed", opt->seed, "Seed of the tiny model's weights and of the step's dropout")->capture_default_str();
    cmd->callback([opt, cmd]() {
        if (!opt->dot.empty()) check_output_path(opt->dot, "--dot", {opt->model_dir});
        if (cmd->count("--set") && !cmd->count("--expr")) throw std::runtime_error("--set: needs --expr");
        if (cmd->count("--expr")) {
            for (const char* flag : {"--model", "--src", "--tgt", "--collapse", "--backward-twice", "--d-model", "--heads", "--ffn",
                                     "--layers", "--seed"})
                if (cmd->count(flag)) throw std::runtime_error(std::string(flag) + ": is for a model's tape, not for --expr");
            if (opt->forward_only && opt->step_backward)
                throw std::runtime_error("--forward-only: cannot go with --step-backward");
            run_expression(*opt);
            command_exit_code() = 0;
            return;
        }
        if (!opt->collapse.empty() && opt->dot.empty()) throw std::runtime_error("--collapse: needs --dot FILE");
        if (opt->forward_only && (opt->step_backward || opt->backward_twice))
            throw std::runtime_error("--forward-only: cannot go with --step-backward or --backward-twice");
        const bool model_given = cmd->count("--model") > 0;
        for (const char* flag : {"--d-model", "--heads", "--ffn", "--layers"})
            if (model_given && cmd->count(flag))
                throw std::runtime_error(std::string(flag) + ": sets the tiny model's shape; --model DIR brings its own");
        ModelBundle bundle;
        if (model_given) {
            bundle = load_model_dir(opt->model_dir);
        } else {
            bundle.tokenizers = sentence_vocabulary(opt->src, opt->tgt);
            ModelConfig c = tiny_tape_config(bundle.tokenizers.source->vocab_size());
            c.d_model = opt->d_model, c.heads = opt->heads, c.ffn = opt->ffn, c.enc_layers = c.dec_layers = opt->layers;
            c.validate();
            bundle.model = std::make_unique<Transformer>(c, opt->seed);
        }
        const auto src = ids_of(*bundle.tokenizers.source, opt->src, "--src");
        const auto tgt = ids_of(*bundle.tokenizers.target, opt->tgt, "--tgt");
        TapeStepOptions so;
        so.src = opt->src, so.tgt = opt->tgt, so.seed = opt->seed, so.backward = !opt->forward_only;
        const ModelConfig& c = bundle.model->config;
        std::cout << "tape: one training step of " << (model_given ? opt->model_dir : std::string("a tiny untrained model")) << " ("
                  << (c.decoder_only() ? "decoder-only, " + std::to_string(c.dec_layers)
                                       : std::to_string(c.enc_layers) + "+" + std::to_string(c.dec_layers))
                  << " layers, C " << c.d_model << ", H " << c.heads << ", F " << c.ffn << ", V " << c.tgt_vocab << "), "
                  << (c.decoder_only() ? "text \"" : "source \"" + std::string(trim(opt->src)) + "\", target \"")
                  << std::string(trim(opt->tgt)) << "\"\n\n";
        const TapeGraph g = record_training_step(*bundle.model, src, tgt, so);
        std::cout << format_tape(g, opt->step_backward);
        if (!opt->dot.empty()) {
            write_file_atomic(opt->dot, tape_dot(g, opt->collapse));
            std::cout << "\nwrote " << opt->dot << " (" << g.tensors.size() << " tensors, " << g.ops.size()
                      << " ops; render: dot -Tsvg " << opt->dot << " -o tape.svg)\n";
        }
        if (opt->backward_twice) std::cout << "\n" << backward_twice_report(*bundle.model, src, tgt, so);
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
