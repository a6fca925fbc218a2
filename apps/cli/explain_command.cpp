// `tapeformer explain`: one sentence walked through a trained model (--model DIR) or an untrained one
// (--init, with a word vocabulary made of the sentence's own words), every stage with its shape, numbers
// and the code that computes it (explain.h).
#include <iostream>
#include <memory>
#include <stdexcept>

#include "tapeformer/run/checkpoint.h"
#include "cli/commands.h"
#include "tapeformer/data/text.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/ops.h"
#include "tapeformer/teach/explain.h"

TF_NAMESPACE_BEGIN

namespace {

struct ExplainCommandOptions {
    std::string model_dir, sentence, tgt;
    bool init = false;
    ModelConfig config;  // with --init
    std::int64_t layers = 1;
    std::string norm = "post";
    std::uint64_t seed = 1;
    ExplainView view;
    bool no_values = false;
    std::string break_grad;  // a deliberately wrong backward (ops.h BrokenGradient), with --backward
    bool full = false;  // --full: view.rows = view.cols = 0
};

}  // namespace

void add_explain_command(CLI::App& app) {
    auto opt = std::make_shared<ExplainCommandOptions>();
    opt->config.d_model = 8;
    opt->config.heads = 2;
    opt->config.ffn = 16;
    opt->config.max_len = 64;
    CLI::App* cmd = app.add_subcommand(
        "explain",
        "Walk one sentence through the model and print every stage in textbook order — text, tokens, ids,\n"
        "embeddings, × √C, + positions, per layer: fused QKV projection, heads, Q Kᵀ/√D, mask, softmax,\n"
        "weights × V, heads merged, out-projection, residual + LayerNorm, FFN; the decoder (causal mask,\n"
        "cross-attention); logits, softmax, the chosen token — each with its shape, a few of its numbers\n"
        "and the file and function of the model that computes it. The numbers are the model's own: every\n"
        "attention, FFN and layer is checked against the module's forward() as it goes.\n"
        "Examples: tapeformer explain --model runs/toy \"the dog sees a cat .\"\n"
        "          tapeformer explain --init \"a b c\" --layer 0 --head 1 --stage scores,mask,softmax --check\n"
        "          tapeformer explain --init \"a b c\" --no-values --backward\n"
        "          tapeformer explain --init \"a b c d e f g h i\" --stage softmax --head 0 --full");
    cmd->add_option("sentence", opt->sentence, "The source sentence")->required();
    auto* model = cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train`");
    auto* init = cmd->add_flag("--init", opt->init,
                               "An untrained model instead of --model: the flags below, a word vocabulary of the sentence's words");
    model->excludes(init);
    cmd->add_option("--tgt", opt->tgt,
                    "The target sentence the decoder is fed (default: the model's greedy translation; with --init the\n"
                    "sentence itself)");
    // -1 is ExplainView's "every layer / head", what leaving the flag out means: not a value to type.
    cmd->add_option("--layer", opt->view.layer, "Only this layer's stages (0-based; encoder and decoder; with --stage, stages matching both)")
        ->check(number_above(0, false));
    cmd->add_option("--head", opt->view.head, "Only this head in per-head stages (0-based)")->check(number_above(0, false));
    cmd->add_option("--stage", opt->view.stages,
                    "Only these stages, comma-separated: text, tokens, ids, embed, scale, positional, norm, qkv, q_proj,\n"
                    "kv_proj, q, k, v, scores, mask, softmax, context, gate, merge, out_proj, add_norm, residual,\n"
                    "ffn_hidden, ffn_out, final_norm, logits, probs, chosen")
        ->delimiter(',');
    cmd->add_flag("--no-values", opt->no_values, "Shapes and code locations only, no numbers");
    auto* rows = cmd->add_option("--rows", opt->view.rows, "Rows of each matrix printed (0: all)")
                     ->check(number_above(0, false))
                     ->capture_default_str();
    auto* cols = cmd->add_option("--cols", opt->view.cols, "Columns of each matrix printed (0: all)")
                     ->check(number_above(0, false))
                     ->capture_default_str();
    auto* full = cmd->add_flag("--full", opt->full, "Whole matrices: every row and column (--rows 0 --cols 0)");
    full->excludes(rows)->excludes(cols);
    cmd->add_flag("--check", opt->view.checks,
                  "Print each stage's invariants (attention rows sum to 1, masked weights exactly 0, LayerNorm rows\n"
                  "mean 0 / variance 1, each module's output equal to the walkthrough's); exit 1 if one fails");
    auto* backward = cmd->add_flag("--backward", opt->view.backward,
                                   "Then run the target's cross-entropy backward and print each stage's gradient norm, in reverse order");
    cmd->add_option("--break-grad", opt->break_grad,
                    "With --backward: run it with a deliberately wrong backward, layernorm-mean (LayerNorm's without its\n"
                    "mean term) or layernorm-variance (without its variance term), to compare the norms with the right ones")
        ->check(CLI::IsMember(broken_gradient_names()))
        ->needs(backward);
    const std::string with_init = " (with --init)";
    cmd->add_option("--d-model", opt->config.d_model, "Model width C" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--heads", opt->config.heads, "Attention heads H" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--ffn", opt->config.ffn, "FFN inner width F" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--layers", opt->layers, "Encoder and decoder layers" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--norm", opt->norm, "post or pre" + with_init)->check(CLI::IsMember({"post", "pre"}))->capture_default_str();
    cmd->add_option("--seed", opt->seed, "Seed of the initial weights" + with_init)->capture_default_str();
    const std::vector<std::string> switches = add_model_switch_flags(*cmd, opt->config, with_init);
    cmd->callback([opt, cmd, switches]() {
        const bool model_given = cmd->count("--model") > 0;
        if (!model_given && !opt->init) throw std::runtime_error("explain: give --model DIR or --init (see tapeformer explain --help)");
        if (cmd->count("--tgt") && trim(opt->tgt).empty()) throw std::runtime_error("--tgt: the target sentence is empty");
        std::vector<std::string> init_only = {"--d-model", "--heads", "--ffn", "--layers", "--norm", "--seed"};
        init_only.insert(init_only.end(), switches.begin(), switches.end());
        for (const std::string& flag : init_only)
            if (model_given && cmd->count(flag))
                throw std::runtime_error(flag + ": only with --init; --model DIR brings its own model");
        ModelBundle bundle;
        if (model_given) {
            bundle = load_model_dir(opt->model_dir);
        } else {
            bundle.tokenizers = sentence_vocabulary(opt->sentence, opt->tgt);
            ModelConfig c = opt->config;
            c.enc_layers = c.dec_layers = opt->layers;
            c.src_vocab = c.tgt_vocab = bundle.tokenizers.source->vocab_size();
            c.norm = parse_norm_position(opt->norm);
            c.validate();
            bundle.model = std::make_unique<Transformer>(c, opt->seed);
        }
        ExplainOptions eo;
        eo.backward = opt->view.backward;
        // An untrained model's greedy translation is noise, often </s> at once: feed it the sentence itself.
        const bool copy = !model_given && !cmd->count("--tgt");
        if (cmd->count("--tgt")) eo.target = &opt->tgt;
        if (copy) eo.target = &opt->sentence;
        opt->view.values = !opt->no_values;
        if (opt->full) opt->view.rows = opt->view.cols = 0;
        if (opt->view.layer < -1 || opt->view.head < -1) check_view(Explanation{}, bundle.model->config, opt->view);
        const BrokenGradient broken = parse_broken_gradient(opt->break_grad.empty() ? "none" : opt->break_grad);
        Explanation ex;
        {
            BrokenGradientScope scope(broken);
            ex = explain(*bundle.model, bundle.tokenizers, opt->sentence, eo);
        }
        check_view(ex, bundle.model->config, opt->view);
        const ModelConfig& c = bundle.model->config;
        std::cout << "explain: " << (model_given ? opt->model_dir : "an untrained model (--init, seed " + std::to_string(opt->seed) + ")")
                  << ": " << (c.decoder_only() ? "decoder-only, " + std::to_string(c.dec_layers)
                                               : std::to_string(c.enc_layers) + "+" + std::to_string(c.dec_layers))
                  << " layers, C " << c.d_model << ", H " << c.heads << ", D "
                  << c.d_model / c.heads << ", F " << c.ffn << ", V " << c.tgt_vocab << ", " << to_string(c.norm) << "-norm";
        for (const std::string& off : switched_off_parts(c)) std::cout << ", " << off;
        std::cout << "\n";
        if (c.decoder_only())  // one sequence: no source side
            std::cout << "B = 1 sentence, T = " << ex.dec_in.size() << " decoder positions (<s> + "
                      << (opt->tgt.empty() ? "the sentence" : "--tgt") << "); the model predicts each next token\n";
        else
            std::cout << "B = 1 sentence, S = " << ex.src.size() << " source tokens (with </s>), T = " << ex.dec_in.size()
                  << " decoder positions (<s> + "
                  << (ex.target_decoded ? "the greedy translation"
                      : copy            ? "the sentence itself: an untrained model's translation is noise; --tgt to change"
                                        : "--tgt")
                  << ")\n";
        if (broken != BrokenGradient::None)
            std::cout << "--break-grad " << to_string(broken) << ": the gradients below are deliberately wrong, "
                      << broken_gradient_description(broken) << "\n";
        std::cout << format_explanation(ex, opt->view);
        if (opt->view.checks)
            std::cout << "\nchecks: " << (ex.checks_passed ? "all passed" : "SOME FAILED (marked FAIL above)") << "\n";
        command_exit_code() = opt->view.checks && !ex.checks_passed ? 1 : 0;
    });
}

TF_NAMESPACE_END
