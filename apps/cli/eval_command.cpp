// `tapeformer eval`: translate a test set and score it against its references (BLEU and chrF as sacreBLEU
// 2.x computes them), and measure how likely the model finds the references (teacher-forced loss).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tapeformer/run/checkpoint.h"
#include "cli/commands.h"
#include "tapeformer/data/text.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

namespace {

struct EvalOptions {
    std::string model_dir;
    std::string mask_heads;  // "E:0:1,A:2:3": these heads' gates set to 0
    std::string src, ref;
    std::string output_hyp;  // empty: hypotheses are not written
    DecodeOptions decode;
    std::int64_t batch_tokens = 4096;
    double label_smoothing = 0.1;
    bool json = false;
    std::string precision = "fp32";
};

// "loss = 2.3456 | nll = 2.1234 | ppl = 8.36"
std::string format_loss(const LossReport& r) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "loss = %.4f | nll = %.4f | ppl = %.2f", r.loss, r.nll, r.ppl);
    return buf;
}

// One hypothesis per --src line. evaluate() scores only pairs with both sides non-empty; a line it skipped
// because its reference is empty is translated here, so that line i of the file still translates line i.
std::vector<std::string> aligned_hypotheses(ModelBundle& bundle, const std::vector<std::string>& src,
                                            const std::vector<std::string>& ref, const EvalReport& report,
                                            const EvalOptions& opt) {
    std::vector<std::string> out(src.size()), unscored;
    std::vector<std::size_t> unscored_at;
    std::size_t next = 0;
    for (std::size_t i = 0; i < src.size(); ++i) {
        if (src[i].empty()) continue;  // an empty source translates to an empty line
        if (ref[i].empty()) {
            unscored.push_back(src[i]);
            unscored_at.push_back(i);
        } else {
            out[i] = report.hypotheses.at(next++);
        }
    }
    if (!unscored.empty()) {
        const auto extra = translate_lines(*bundle.model, bundle.tokenizers, unscored, opt.decode, opt.batch_tokens);
        for (std::size_t k = 0; k < extra.size(); ++k) out[unscored_at[k]] = extra[k];
    }
    return out;
}

}  // namespace

void add_eval_command(CLI::App& app) {
    auto opt = std::make_shared<EvalOptions>();
    CLI::App* cmd = app.add_subcommand(
        "eval",
        "Translate --src with a trained model and score it against --ref: corpus BLEU and chrF (sacreBLEU 2.x\n"
        "defaults), exact match (the fraction of translations equal to their reference: the score of copy and\n"
        "reverse) and the teacher-forced loss, NLL and perplexity of the references (dropout off).\n"
        "Line pairs with an empty source or reference are left out of the scores.");
    cmd->add_option("--model", opt->model_dir, "Model directory written by `tapeformer train`")->required();
    add_mask_heads_option(*cmd, opt->mask_heads);
    cmd->add_option("--src", opt->src, "Source sentences, one per line")->required()->check(CLI::ExistingFile);
    cmd->add_option("--ref", opt->ref, "Reference translations, one per line, aligned with --src")
        ->required()
        ->check(CLI::ExistingFile);
    add_decode_options(*cmd, opt->decode, opt->batch_tokens);
    cmd->add_option("--label-smoothing", opt->label_smoothing,
                    "Label smoothing of the reported loss (nll and ppl never use it)")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                double x = 0;
                if (!CLI::detail::lexical_cast(text, x)) return "'" + text + "' is not a number";
                return x >= 0 && x < 1 ? "" : "must be in [0, 1), got " + text;
            },
            "[0, 1)"))
        ->capture_default_str();
    cmd->add_flag("--json", opt->json,
                  "Print one JSON line {\"bleu\", \"chrf\", \"exact_match\", \"loss\", \"nll\", \"ppl\", \"signature\"}\n"
                  "instead of text (exact_match: the fraction of translations equal to their reference)");
    cmd->add_option("--output-hyp", opt->output_hyp,
                    "Also write the translations to this file, one per --src line (default: not written)");
    add_precision_option(*cmd, opt->precision);
    cmd->callback([opt]() {
        if (!opt->output_hyp.empty()) check_output_path(opt->output_hyp, "--output-hyp", {opt->src, opt->ref, opt->model_dir});
        apply_precision(opt->precision);
        const std::vector<std::string> src = read_lines(opt->src), ref = read_lines(opt->ref);
        if (src.size() != ref.size())
            throw std::runtime_error("--src '" + opt->src + "' has " + std::to_string(src.size()) + " lines but --ref '" +
                                     opt->ref + "' has " + std::to_string(ref.size()) +
                                     "; they must be aligned line by line");
        std::size_t scorable = 0;
        for (std::size_t i = 0; i < src.size(); ++i) scorable += (!src[i].empty() && !ref[i].empty()) ? 1 : 0;
        if (scorable == 0)
            throw std::runtime_error("--src '" + opt->src + "' and --ref '" + opt->ref +
                                     "' hold no line pair with both sides non-empty: nothing to score");
        ModelBundle bundle = load_model_dir(opt->model_dir);
        if (bundle.model->config.decoder_only())
            throw std::invalid_argument("eval: " + opt->model_dir + " holds a decoder-only model (a language model, no source "
                                        "side): use tapeformer generate");
        apply_mask_heads(*bundle.model, opt->mask_heads);
        if (!bundle.note.empty()) std::cerr << "tapeformer: note: " << bundle.note << "\n";
        EvalReport report;
        try {
            report = evaluate(*bundle.model, bundle.tokenizers, src, ref, opt->decode, opt->label_smoothing,
                              opt->batch_tokens, terminal_progress("translating"));
        } catch (const std::runtime_error& e) {  // nothing to score: name the files
            throw std::runtime_error("--src '" + opt->src + "' / --ref '" + opt->ref + "': " + e.what());
        }

        const std::size_t skipped = src.size() - scorable;
        if (skipped > 0)
            std::cerr << "tapeformer: note: " << skipped << " of " << src.size()
                      << " line pairs have an empty source or reference and are not scored\n";
        if (report.truncated > 0)
            std::cerr << "tapeformer: note: " << report.truncated << " sources were longer than the model's "
                      << bundle.model->config.max_len - 1 << " tokens; only their beginning was translated\n";
        if (report.too_long_for_loss > 0)
            std::cerr << "tapeformer: note: the loss is of " << report.loss_pairs << " of " << scorable << " pairs; "
                      << report.too_long_for_loss << " have a side longer than the model's "
                      << bundle.model->config.max_len - 1 << " tokens and are left out of it\n";
        if (!opt->output_hyp.empty()) {
            std::string text;
            for (const std::string& line : aligned_hypotheses(bundle, src, ref, report, *opt)) text += line + '\n';
            write_file_atomic(opt->output_hyp, text);
        }

        if (opt->json) {
            const nlohmann::json j = {{"bleu", report.bleu.score}, {"chrf", report.chrf.score},
                                      {"exact_match", report.exact.fraction()},
                                      {"loss", report.loss.loss},  {"nll", report.loss.nll},
                                      {"ppl", report.loss.ppl},    {"signature", report.bleu.signature()}};
            std::cout << j.dump() << "\n";
        } else {
            std::cout << report.bleu.format() << "\n"
                      << "BLEU signature: " << report.bleu.signature() << "\n"
                      << report.chrf.format() << "\n"
                      << "chrF signature: " << report.chrf.signature() << "\n"
                      << report.exact.format() << "  (translations equal to their reference)\n"
                      << format_loss(report.loss) << "  (references, teacher-forced, label smoothing "
                      << opt->label_smoothing << ", " << report.loss.tokens << " target tokens)\n";
        }
        finish_standard_output();  // "cannot write to standard output: <the system's reason>"
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
