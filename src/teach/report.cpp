// The training report (report.h): reads what a run wrote, draws each section with the SVG helpers of svg.h
// and the attention maps of attention_maps.h, and puts them on one page. Pictures of the model's fixed parts
// are computed by the same functions the model uses (positional table, masks, the loss's backward).
#include "tapeformer/teach/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tapeformer/study/attention_maps.h"
#include "tapeformer/autograd.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/data/text.h"
#include "tapeformer/io.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/run/train_settings.h"
#include "tapeformer/ops.h"
#include "tapeformer/teach/svg.h"
#include "tapeformer/run/train.h"
#include "run/metrics_line.h"

TF_NAMESPACE_BEGIN

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::vector<ReportSection>& report_sections() {
    static const std::vector<ReportSection> sections = {
        {"overview", "The run"},
        {"loss", "Training and validation loss"},
        {"perplexity", "Perplexity"},
        {"learning-rate", "Learning rate as trained"},
        {"bleu", "Validation BLEU"},
        {"schedule", "The learning-rate schedule"},
        {"grad-norms", "Gradient norm per layer"},
        {"head-importance", "Head importance over training"},
        {"head-entropy", "Attention entropy over training"},
        {"pruning", "Pruning curve"},
        {"attention", "Attention maps of validation sentences"},
        {"positional", "Positional encoding"},
        {"masks", "Padding and causal masks"},
        {"label-smoothing", "The label-smoothed target distribution"},
    };
    return sections;
}

namespace {

std::string num(double v, const char* f = "%.4g") {
    char buf[48];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

// What a JSON-lines file holds: the lines kept, and "PATH:LINE: what is wrong" for each line left out.
struct JsonLines {
    std::vector<json> lines;
    std::vector<std::string> problems;
};

// Every object line of a JSON-lines file that `check` finds nothing wrong with ("" = fine); none if the file
// is absent. A line that is not JSON (cut short by a crash), not an object or that `check` faults is named
// in `problems`, as is a path that is a directory or cannot be opened.
JsonLines read_jsonl(const std::string& path, const std::function<std::string(const json&)>& check) {
    JsonLines out;
    std::error_code ec;
    if (!fs::exists(path, ec)) return out;
    if (fs::is_directory(path, ec)) {
        out.problems.push_back(path + " is a directory, not a file");
        return out;
    }
    std::ifstream in(path);
    if (!in) {
        out.problems.push_back(path + " cannot be opened");
        return out;
    }
    std::int64_t number = 0;
    for (std::string line; std::getline(in, line);) {
        ++number;
        if (trim(line).empty()) continue;
        std::string wrong;
        json j;
        try {
            j = json::parse(line);
            wrong = j.is_object() ? check(j) : "not a JSON object";
        } catch (const json::exception&) {
            wrong = "not valid JSON (a line cut short?)";
        }
        if (wrong.empty()) out.lines.push_back(std::move(j));
        else out.problems.push_back(path + ":" + std::to_string(number) + ": " + wrong + "; line left out");
    }
    if (in.bad()) out.problems.push_back(path + ": read error after line " + std::to_string(number));
    return out;
}

std::string missing(const std::string& why) { return "<p class=\"missing\">" + xml_escape(why) + "</p>\n"; }
std::string para(const std::string& text) { return "<p>" + text + "</p>\n"; }

double get(const json& j, const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

// Everything the sections read, loaded once; each part may be absent, with the reason.
struct RunData {
    std::string dir;
    std::optional<TrainConfig> run;  // run.json, read through the settings table (none when absent or unreadable)
    std::string run_error;
    std::vector<MetricsLine> train, valid;  // metrics.jsonl lines by type
    bool has_metrics = false;
    std::vector<std::string> problems;  // lines of metrics.jsonl and heads.jsonl left out, and why
    std::vector<json> heads;       // heads.jsonl
    json prune;                    // the pruning JSON (null when absent)
    std::string prune_path;
    ModelBundle model;             // model.safetensors and tokenizers (model null when not loadable)
    std::string model_error;
    std::vector<std::string> src, tgt;  // sentences for attention maps, masks and smoothing
    std::string sentences_from, sentences_error;
    // The masks' batch: pairs of the same file whose sources have different lengths (copy and reverse sets
    // begin with equal lengths, which leave the padding mask blank); src/tgt when there are none.
    std::vector<std::string> mask_src, mask_tgt;
    double label_smoothing = 0.1;
    bool label_smoothing_known = false;
};

RunData load_run(const std::string& dir, const ReportOptions& opt) {
    RunData d;
    d.dir = dir;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw std::runtime_error("report: '" + dir + "' is not a directory");
    const fs::path p(dir);
    if (!fs::exists(p / "run.json") && !fs::exists(p / "metrics.jsonl") && !fs::exists(p / "model.safetensors"))
        throw std::runtime_error("report: '" + dir + "' holds none of run.json, metrics.jsonl and model.safetensors "
                                 "(is it a directory written by tapeformer train?)");
    if (fs::exists(p / "run.json")) {
        try {
            d.run = train_config_from_json(read_file((p / "run.json").string()));
            d.label_smoothing = d.run->optim.label_smoothing;
            d.label_smoothing_known = true;
        } catch (const std::exception& e) {
            d.run.reset();
            d.run_error = (p / "run.json").string() + " cannot be read: " + e.what();
        }
    } else {
        d.run_error = "no run.json in " + dir;
    }
    d.has_metrics = fs::is_regular_file(p / "metrics.jsonl", ec);  // a directory is named in `problems`
    JsonLines metrics = read_jsonl((p / "metrics.jsonl").string(), metrics_line_problem);
    for (const json& j : metrics.lines) {
        MetricsLine line = metrics_line_from_json(j);
        (line.type == MetricsLine::Type::Train ? d.train : d.valid).push_back(std::move(line));
    }
    JsonLines heads = read_jsonl((p / "heads.jsonl").string(), [](const json&) { return std::string(); });
    d.heads = std::move(heads.lines);
    d.problems = std::move(metrics.problems);
    d.problems.insert(d.problems.end(), heads.problems.begin(), heads.problems.end());

    d.prune_path = opt.prune_json.empty() ? (p / "prune.json").string() : opt.prune_json;
    if (!opt.prune_json.empty() || fs::exists(d.prune_path)) {
        try {
            d.prune = json::parse(read_file(d.prune_path));
            if (!d.prune.contains("models")) throw std::runtime_error("no \"models\" list (expected `heads prune --json` output)");
        } catch (const std::exception& e) {
            throw std::runtime_error("report: --prune '" + d.prune_path + "': " + e.what());
        }
    }

    try {
        d.model = load_model_dir(dir);
    } catch (const std::exception& e) {
        d.model_error = e.what();
    }

    // Sentences: the options', else the run's validation files (paths as training was given them).
    std::string src = opt.src, tgt = opt.tgt;
    if (src.empty() && d.run) {
        src = d.run->data.valid_src;
        tgt = d.run->data.valid_tgt;
    }
    if (!opt.src.empty()) d.src = read_lines(opt.src);  // given by the user: an unreadable file is an error
    if (!opt.tgt.empty()) d.tgt = read_lines(opt.tgt);
    if (opt.src.empty() && !src.empty()) {
        try {
            d.src = read_lines(src);
            if (!tgt.empty()) d.tgt = read_lines(tgt);
        } catch (const std::exception& e) {
            d.sentences_error = std::string(e.what()) + " (give sentences with --src/--tgt)";
            d.src.clear(), d.tgt.clear();
        }
    }
    if (src.empty() && d.sentences_error.empty())
        d.sentences_error = "the run had no validation data: give sentences with --src (and --tgt)";
    // For the masks: the first pairs (of at most 1000 lines) each with a source word count not seen yet.
    std::set<std::size_t> lengths;
    for (std::size_t i = 0; i < d.src.size() && i < 1000 && d.mask_src.size() < 3; ++i) {
        if (trim(d.src[i]).empty() || (i < d.tgt.size() && trim(d.tgt[i]).empty())) continue;
        const std::string line(trim(d.src[i]));
        if (!lengths.insert(std::size_t(std::count(line.begin(), line.end(), ' '))).second) continue;
        d.mask_src.push_back(line);
        d.mask_tgt.push_back(i < d.tgt.size() ? std::string(trim(d.tgt[i])) : "");
    }
    // Keep the first non-empty pairs, as many as asked for.
    std::vector<std::string> s, t;
    for (std::size_t i = 0; i < d.src.size() && int(s.size()) < std::max(1, opt.sentences); ++i) {
        if (trim(d.src[i]).empty() || (i < d.tgt.size() && trim(d.tgt[i]).empty())) continue;
        s.push_back(std::string(trim(d.src[i])));
        t.push_back(i < d.tgt.size() ? std::string(trim(d.tgt[i])) : "");
    }
    if (!d.tgt.empty() && d.tgt.size() != d.src.size())
        throw std::runtime_error("report: " + std::to_string(d.src.size()) + " source lines but " + std::to_string(d.tgt.size()) +
                                 " target lines");
    d.src = s, d.tgt = t;
    if (d.mask_src.size() < 2) d.mask_src = d.src, d.mask_tgt = d.tgt;  // all of one length: the sentences shown
    d.sentences_from = opt.src.empty() ? src : opt.src;
    return d;
}

// A chart's line: style given by name, so that every field is set (-Wmissing-field-initializers).
LineSeries series(const std::string& name, std::vector<double> x, std::vector<double> y, bool dashed = false,
                  bool markers = false, const std::string& color = "") {
    LineSeries s;
    s.name = name, s.x = std::move(x), s.y = std::move(y), s.dashed = dashed, s.markers = markers, s.color = color;
    return s;
}

std::vector<double> column(const std::vector<MetricsLine>& lines, double MetricsLine::*field) {
    std::vector<double> v;
    for (const MetricsLine& line : lines) v.push_back(line.*field);
    return v;
}

std::vector<double> steps(const std::vector<MetricsLine>& lines) {
    std::vector<double> v;
    for (const MetricsLine& line : lines) v.push_back(double(line.step));
    return v;
}


// ---- sections --------------------------------------------------------------------------------------------

std::string overview(const RunData& d) {
    std::ostringstream o;
    o << "<table>\n";
    auto row = [&](const std::string& k, const std::string& v) { o << "<tr><th>" << xml_escape(k) << "</th><td>" << xml_escape(v) << "</td></tr>\n"; };
    row("directory", d.dir);
    if (d.run) {
        const TrainConfig& c = *d.run;
        // Each model setting as run.json holds it ("post", "256"), through the settings table.
        std::string model = c.model.decoder_only() ? "decoder-only" : "";  // the encoder-decoder says nothing, as before
        for (const char* k : {"d_model", "heads", "ffn", "enc_layers", "dec_layers", "norm", "tie", "positional", "attention"}) {
            if (c.model.decoder_only() && std::string(k) == "enc_layers") continue;  // no encoder
            model += std::string(model.empty() ? "" : ", ") + k + " " + find_setting(model_settings(), k, /*by_key=*/true)->get(c.model);
        }
        model += ", dropout " + num(c.model.dropout);
        for (const std::string& off : switched_off_parts(c.model)) model += ", " + off;
        row("model", model);
        const Setting<TrainConfig>* optimizer = find_setting(train_settings(), "optim.optimizer", /*by_key=*/true);
        const Setting<TrainConfig>* schedule = find_setting(train_settings(), "optim.schedule", /*by_key=*/true);
        row("optimisation", optimizer->get(c) + ", schedule " + schedule->get(c) + " (lr " + num(c.optim.schedule.lr) +
                                ", warmup " + std::to_string(c.optim.schedule.warmup) +
                                (c.optim.cooldown > 0 ? ", cooldown " + num(c.optim.cooldown) : std::string()) + "), label smoothing " +
                                num(c.optim.label_smoothing) + ", clip " + num(c.optim.clip));
        row("data", c.data.train_src + (c.model.decoder_only() ? "" : " / " + c.data.train_tgt) + ", batch tokens " +
                        std::to_string(c.data.batch_tokens));
        if (c.overfit_batch) row("mode", "--overfit-batch: one batch, every step");
    }
    if (!d.train.empty()) {
        const MetricsLine& last = d.train.back();
        auto or_zero = [](double v) { return std::isnan(v) ? 0.0 : v; };  // absent from a line of an older version
        row("trained", std::to_string(last.step) + " steps, " + num(or_zero(last.elapsed), "%.1f") +
                           " s, last logged loss " + num(or_zero(last.loss)));
    }
    double best = -1;
    std::int64_t best_step = -1;
    for (const MetricsLine& v : d.valid)
        if (v.valid_bleu && *v.valid_bleu > best) best = *v.valid_bleu, best_step = v.step;
    if (best_step >= 0) row("best validation BLEU", num(best, "%.2f") + " at step " + std::to_string(best_step));
    if (d.model.model) row("parameters", std::to_string(d.model.model->parameter_count()));
    o << "</table>\n";
    if (!d.run_error.empty()) o << missing(d.run_error);
    if (!d.model_error.empty()) o << missing("model: " + d.model_error);
    for (const std::string& problem : d.problems) o << missing(problem);
    return o.str();
}

std::string metrics_missing(const RunData& d) {
    const fs::path path = fs::path(d.dir) / "metrics.jsonl";
    std::error_code ec;
    if (fs::is_directory(path, ec)) return path.string() + " is a directory, not a file";
    if (!d.has_metrics) return "no metrics.jsonl in " + d.dir;
    const std::string left_out = d.problems.empty() ? "" : " it can draw (lines left out: see the overview)";
    return "metrics.jsonl in " + d.dir + " has no training lines" + (left_out.empty() ? " yet" : left_out);
}

std::string loss_section(const RunData& d) {
    if (d.train.empty()) return missing(metrics_missing(d));
    LineChart c;
    c.id = "chart-loss";
    c.title = "loss per target token";
    c.x_label = "step";
    c.y_label = "loss";
    const auto train_steps = steps(d.train);
    c.series.push_back(series("train (label-smoothed)", train_steps, column(d.train, &MetricsLine::loss)));
    c.series.push_back(series("train nll", train_steps, column(d.train, &MetricsLine::nll), true));
    std::string note;
    if (!d.valid.empty()) {
        c.series.push_back(series("valid (label-smoothed)", steps(d.valid), column(d.valid, &MetricsLine::valid_loss), false, true));
        c.series.push_back(series("valid nll", steps(d.valid), column(d.valid, &MetricsLine::valid_nll), true, true));
    } else {
        note = missing("no validation lines: train with --valid-src/--valid-tgt to see the validation loss");
    }
    return para("Training values are means over the target tokens since the previous log line; validation values over "
                "the whole validation set (dropout off). The label-smoothed loss cannot reach 0: its floor is the entropy "
                "of the smoothed target (last section); the nll can.") +
           line_chart_svg(c) + note;
}

std::string perplexity_section(const RunData& d) {
    if (d.train.empty()) return missing(metrics_missing(d));
    LineChart c;
    c.id = "chart-perplexity";
    c.title = "perplexity = exp(nll)";
    c.x_label = "step";
    c.y_label = "perplexity";
    c.log_y = true;
    c.series.push_back(series("train", steps(d.train), column(d.train, &MetricsLine::ppl)));
    if (!d.valid.empty()) c.series.push_back(series("valid", steps(d.valid), column(d.valid, &MetricsLine::valid_ppl), false, true));
    return para("Perplexity is the number of equally likely tokens the model is as unsure as; 1 is certainty.") +
           line_chart_svg(c) + (d.valid.empty() ? missing("no validation lines (train with --valid-src/--valid-tgt)") : "");
}

std::string lr_section(const RunData& d) {
    if (d.train.empty()) return missing(metrics_missing(d));
    LineChart c;
    c.id = "chart-learning-rate";
    c.title = "learning rate at each log step";
    c.x_label = "step";
    c.y_label = "learning rate";
    c.series.push_back(series("lr", steps(d.train), column(d.train, &MetricsLine::lr), false, true));
    return line_chart_svg(c);
}

std::string bleu_section(const RunData& d) {
    std::vector<double> steps, bleu, exact_steps, exact;
    for (const MetricsLine& v : d.valid) {
        if (v.valid_bleu) steps.push_back(double(v.step)), bleu.push_back(*v.valid_bleu);
        if (v.valid_exact) exact_steps.push_back(double(v.step)), exact.push_back(100 * *v.valid_exact);
    }
    if (steps.empty())
        return missing(d.valid.empty() ? "no validations in metrics.jsonl: train with --valid-src/--valid-tgt"
                                       : "validation ran without BLEU (--no-valid-bleu)");
    LineChart c;
    c.id = "chart-bleu";
    c.title = exact.empty() ? "greedy BLEU on the validation set" : "greedy BLEU and exact match on the validation set";
    c.x_label = "step";
    c.y_label = exact.empty() ? "BLEU" : "BLEU / % exact";
    c.series.push_back(series("valid BLEU", steps, bleu, false, true));
    // Exact match is the score of copy and reverse: BLEU credits a half-right line, exact match does not.
    if (!exact.empty()) c.series.push_back(series("% exact", exact_steps, exact, true, true));
    return line_chart_svg(c);
}

std::string schedule_section(const RunData& d) {
    if (!d.run) return missing(d.run_error + ": the schedule's settings are in run.json");
    const Schedule s = d.run->optim.schedule;
    std::int64_t total = d.run->max_steps;
    if (!d.train.empty()) total = std::max<std::int64_t>(total, d.train.back().step);
    total = std::max<std::int64_t>({total, s.total_steps, 2 * s.warmup, 10});
    LineChart c;
    c.id = "chart-schedule";
    c.title = s.describe();
    c.x_label = "step";
    c.y_label = "learning rate";
    // With a cooldown, the curve takes the run to end at its --max-steps, or else at the last step logged
    const double cooldown = d.run->optim.cooldown;
    const std::int64_t end = d.run->max_steps ? d.run->max_steps : d.train.empty() ? total : d.train.back().step;
    LineSeries planned = series(cooldown > 0 ? "schedule lr(step) × cooldown" : "schedule lr(step)", {}, {});
    const std::int64_t n = std::min<std::int64_t>(total, 400);
    for (std::int64_t i = 0; i <= n; ++i) {
        const std::int64_t step = std::max<std::int64_t>(1, total * i / n);
        planned.x.push_back(double(step));
        planned.y.push_back(s.lr_at(step) * cooldown_factor(double(step - 1) / double(end), cooldown));
    }
    c.series.push_back(planned);
    if (!d.train.empty()) c.series.push_back(series("logged", steps(d.train), column(d.train, &MetricsLine::lr), false, true));
    if (s.warmup > 0) c.x_marks.push_back({double(s.warmup), "warmup ends"});
    const std::string cooling =
        cooldown > 0 ? " Over the run's last " + num(100 * cooldown) + "% the rate falls linearly to 0 (--cooldown): the curve "
                       "takes the run to end at step " + std::to_string(end) + "; a run that stops by its time budget "
                       "cools down by the clock, so there the dots may leave the curve."
                     : std::string();
    return para("The learning rate as a function of the update step (schedule.h), over the run's steps; the dots are "
                "the rates training logged, which lie on the curve." + cooling) +
           line_chart_svg(c);
}

std::string grad_norm_section(const RunData& d) {
    std::vector<std::string> layers;                 // in first-seen order
    std::map<std::string, LineSeries> by_layer;
    for (const MetricsLine& line : d.train)
        for (const auto& [name, norm] : line.layer_grad_norms) {
            if (!by_layer.count(name)) layers.push_back(name), by_layer[name].name = name;
            by_layer[name].x.push_back(double(line.step));
            by_layer[name].y.push_back(norm);
        }
    if (layers.empty())
        return missing(d.train.empty() ? metrics_missing(d)
                                       : "metrics.jsonl has no per-layer gradient norms (runs of older tapeformer versions "
                                         "do not log them; train again to see them)");
    LineChart c;
    c.id = "chart-grad-norms";
    c.title = "‖∂L/∂θ‖₂ per layer, before clipping";
    c.x_label = "step";
    c.y_label = "gradient norm";
    c.log_y = true;
    c.height = std::max(300, 60 + 16 * int(layers.size()));
    for (const std::string& name : layers) {
        LineSeries s = by_layer[name];
        s.dashed = name.rfind("decoder", 0) == 0;
        c.series.push_back(s);
    }
    LineChart total;
    total.id = "chart-grad-norm-total";
    total.title = "global gradient norm (what --clip compares)";
    total.x_label = "step";
    total.y_label = "gradient norm";
    total.log_y = true;
    total.series.push_back(series("‖g‖", steps(d.train), column(d.train, &MetricsLine::grad_norm)));
    if (d.run && d.run->optim.clip > 0) {
        const double clip = d.run->optim.clip;
        total.series.push_back(series("--clip " + num(clip), {total.series[0].x.front(), total.series[0].x.back()}, {clip, clip}, true, false, "#888"));
    }
    // What this run's plot shows at its first logged step, not what a textbook run would.
    std::string first_step;
    for (const MetricsLine& line : d.train) {
        if (line.layer_grad_norms.empty()) continue;
        auto [lo, hi] = std::minmax_element(line.layer_grad_norms.begin(), line.layer_grad_norms.end(),
                                            [](const auto& a, const auto& b) { return a.second < b.second; });
        first_step = " In this run, at step " + std::to_string(line.step) + " the largest is " + xml_escape(hi->first) + "'s (" +
                     num(hi->second, "%.3g") + ") and the smallest " + xml_escape(lo->first) + "'s (" + num(lo->second, "%.3g") + ").";
        break;
    }
    return para("The gradient of the loss reaching each layer's parameters at the log steps." + first_step +
                " Which layers get the larger gradients early in training, those near the output or those near the input? "
                "Train once with --norm " + std::string(d.run && d.run->model.norm == NormPosition::Pre ? "post" : "pre") +
                " and compare: the gap between them is what warmup protects post-norm from.") +
           line_chart_svg(c) + line_chart_svg(total);
}

// heads.jsonl as layer × head heatmaps at a few steps: rows "E0", "D1", ... (kind and layer), columns heads.
std::string heads_section(const RunData& d, const ReportOptions& opt, const char* field, const char* id, double lo, double hi_default,
                          const std::string& what) {
    if (d.heads.empty())
        return missing("no heads.jsonl in " + d.dir + ": train with --log-heads-every N to record per-head " + what);
    std::vector<std::size_t> picks;
    const std::size_t n = d.heads.size(), k = std::min<std::size_t>(n, std::size_t(std::max(1, opt.head_snapshots)));
    for (std::size_t i = 0; i < k; ++i) {
        const std::size_t at = k == 1 ? n - 1 : i * (n - 1) / (k - 1);
        if (picks.empty() || picks.back() != at) picks.push_back(at);
    }
    double hi = hi_default;
    if (!(hi > lo))
        for (const json& line : d.heads)
            for (const json& h : line.value("heads", json::array())) hi = std::max(hi, get(h, field));
    std::ostringstream o;
    o << "<div class=\"row\">\n";
    for (std::size_t at : picks) {
        const json& line = d.heads[at];
        std::vector<std::string> rows;
        std::map<std::string, std::vector<double>> cells;
        int H = 0;
        for (const json& h : line.value("heads", json::array())) {
            const std::string name = h.value("head", "");  // KIND:layer:head
            const std::size_t a = name.find(':'), b = name.rfind(':');
            if (a == std::string::npos || b == a) continue;
            const std::string row = name.substr(0, a) + name.substr(a + 1, b - a - 1);
            const int head = std::stoi(name.substr(b + 1));
            if (!cells.count(row)) rows.push_back(row);
            auto& r = cells[row];
            if (int(r.size()) <= head) r.resize(std::size_t(head + 1), std::nan(""));
            r[std::size_t(head)] = get(h, field);
            H = std::max(H, head + 1);
        }
        Heatmap m;
        m.id = std::string(id) + "-step" + std::to_string(line.value("step", 0));
        m.title = "step " + std::to_string(line.value("step", 0));
        m.rows = rows;
        for (int h = 0; h < H; ++h) m.columns.push_back("head " + std::to_string(h));
        for (const auto& r : rows) {
            auto v = cells[r];
            v.resize(std::size_t(H), std::nan(""));
            m.values.push_back(v);
        }
        m.lo = lo, m.hi = hi > lo ? hi : lo + 1;
        m.cell_width = m.cell_height = 26;
        m.left = 40, m.top = 70;
        m.row_title = "layer", m.column_title = "head";
        o << "<figure>" << heatmap_svg(m) << "</figure>\n";
    }
    o << "</div>\n";
    return para("Rows are attentions and layers (E encoder self-attention, D decoder self-attention, A cross-attention; "
                "E1 = encoder layer 1), columns heads; darker is higher (colour range " + num(lo) + " to " + num(hi) +
                "). Measured on each logged step's training batch, as heads.jsonl records. " + what) +
           o.str();
}

std::string pruning_section(const RunData& d) {
    if (d.prune.is_null())
        return missing("no pruning curve: make one with `tapeformer heads prune --model " + d.dir +
                       " --src ... --ref ... --imp-src ... --imp-tgt ... --json " + d.prune_path + "` (or give --prune FILE)");
    LineChart c;
    c.id = "chart-pruning";
    c.title = "BLEU as heads are masked (order " + d.prune.value("order", std::string("?")) + ")";
    c.x_label = "heads masked (%)";
    c.y_label = "BLEU";
    for (const json& m : d.prune["models"]) {
        LineSeries s = series(m.value("model", std::string("model")), {}, {});
        s.markers = true;
        for (const json& p : m.value("curve", json::array())) s.x.push_back(100 * get(p, "fraction")), s.y.push_back(get(p, "bleu"));
        c.series.push_back(s);
    }
    return para("From " + xml_escape(d.prune_path) + ": the least important heads are masked first (Michel et al. 2019); "
                "a flat start means many heads can go.") +
           line_chart_svg(c);
}

std::string attention_section(const RunData& d) {
    if (!d.model.model) return missing("no model to run: " + d.model_error);
    if (d.src.empty()) return missing(d.sentences_error.empty() ? "no sentences" : d.sentences_error);
    std::ostringstream o;
    o << para("Each sentence once through the model (dropout off), " +
              std::string(d.tgt.empty() || d.tgt[0].empty() ? "the target decoded greedily" : "teacher-forced with its reference") +
              ". Rows are queries, columns keys; each row sums to 1. Sentences from " + xml_escape(d.sentences_from) + ".");
    for (std::size_t i = 0; i < d.src.size(); ++i) {
        const std::string* tgt = i < d.tgt.size() && !d.tgt[i].empty() ? &d.tgt[i] : nullptr;
        AttentionMaps maps;
        try {
            maps = attention_maps(*d.model.model, d.model.tokenizers, d.src[i], tgt);
        } catch (const std::exception& e) {
            o << missing("sentence " + std::to_string(i + 1) + ": " + e.what());
            continue;
        }
        o << "<h3>sentence " << i + 1 << ": <code>" << xml_escape(d.src[i]) << "</code></h3>\n";
        const struct {
            char kind;
            const std::vector<std::vector<AttentionMatrix>>& maps;
            const std::vector<std::string>&q, &k;
        } groups[] = {{'E', maps.encoder_self, maps.src, maps.src}, {'D', maps.decoder_self, maps.tgt_in, maps.tgt_in},
                      {'A', maps.cross, maps.tgt_in, maps.src}};
        for (const auto& g : groups) {
            o << "<div class=\"row\">\n";
            for (std::size_t l = 0; l < g.maps.size(); ++l)
                for (std::size_t h = 0; h < g.maps[l].size(); ++h) {
                    const std::string name = std::string(1, g.kind) + ":" + std::to_string(l) + ":" + std::to_string(h);
                    std::string svg = attention_svg(g.maps[l][h], g.q, g.k, name);  // 28-px cells, query/key titled
                    const std::string id = "chart-attention-s" + std::to_string(i + 1) + "-" + std::string(1, g.kind) + "-" +
                                           std::to_string(l) + "-" + std::to_string(h);
                    svg.insert(4, " id=\"" + id + "\"");  // after "<svg"
                    o << "<figure>" << svg << "</figure>\n";
                }
            o << "</div>\n";
        }
    }
    return o.str();
}

std::string positional_section(const RunData& d) {
    if (!d.model.model) return missing("no model to read the table from: " + d.model_error);
    const Transformer& m = *d.model.model;
    if (m.config.positional == PositionalKind::None)
        return missing("this model has no positional encoding (--positional none): it sees each sentence as a bag of tokens");
    const Tensor& t = m.positional.table;  // (max_len, C)
    const std::int64_t P = std::min<std::int64_t>(t.size(0), 64), C = t.size(1);
    Heatmap h;
    h.id = "chart-positional";
    h.title = std::string(to_string(m.config.positional)) + " positional encoding PE[pos, i], positions 0.." + std::to_string(P - 1);
    double extreme = 0;
    for (std::int64_t p = 0; p < P; ++p) {
        h.rows.push_back("pos " + std::to_string(p));
        std::vector<double> row(static_cast<std::size_t>(C));
        for (std::int64_t i = 0; i < C; ++i) row[std::size_t(i)] = t.data()[p * C + i], extreme = std::max(extreme, std::abs(row[std::size_t(i)]));
        h.values.push_back(row);
    }
    for (std::int64_t i = 0; i < C; ++i) h.columns.push_back("dim " + std::to_string(i));
    h.scale = ColorScale::diverging;
    h.lo = -std::max(extreme, 1e-12), h.hi = -h.lo;
    h.cell_width = int(std::clamp<std::int64_t>(768 / C, 2, 14));
    h.cell_height = 8;
    h.label_every = C > 64 ? 16 : 4;
    h.left = 60, h.top = 60;
    h.hover = P * C <= 8192;
    h.row_title = "position", h.column_title = "dimension i";
    return para(m.config.positional == PositionalKind::Sinusoidal
                    ? "PE[pos, 2i] = sin(pos / 10000^(2i/C)), PE[pos, 2i+1] = cos(pos / 10000^(2i/C)) (nn/embedding.h): each "
                      "pair of dimensions is a clock of its own frequency, fast on the left, slow on the right. Blue is −" +
                          num(extreme) + ", red +" + num(extreme) + "."
                    : "The learned table (max_len, C) as trained. Blue is −" + num(extreme) + ", red +" + num(extreme) + ".") +
           "<figure>" + heatmap_svg(h) + "</figure>\n";
}

// The pictures the masks of nn/attention.h give for a batch of the sentences: 1 where a key is hidden (−∞).
std::string masks_section(const RunData& d) {
    if (!d.model.model) return missing("no model (its tokenizer and pad id make the batch): " + d.model_error);
    if (d.src.empty()) return missing(d.sentences_error.empty() ? "no sentences" : d.sentences_error);
    const ModelConfig& mc = d.model.model->config;
    std::vector<Example> ex;
    for (std::size_t i = 0; i < d.mask_src.size(); ++i) {
        Example e;
        e.src = d.model.tokenizers.source->encode(d.mask_src[i]);
        e.tgt = d.model.tokenizers.target->encode(i < d.mask_tgt.size() && !d.mask_tgt[i].empty() ? d.mask_tgt[i] : d.mask_src[i]);
        ex.push_back(e);
    }
    std::vector<std::int64_t> rows(ex.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = std::int64_t(i);
    const Batch b = make_batch(ex, rows);
    auto hidden = [](real v) { return std::isinf(v) ? 1.0 : 0.0; };
    auto text = [](double v) { return v > 0.5 ? std::string("−∞ (hidden)") : std::string("0 (visible)"); };

    const Tensor pad = key_padding_mask(b.src, b.B, b.S, mc.pad_id);  // (B, 1, 1, S)
    Heatmap p;
    p.id = "chart-mask-padding";
    p.title = "key padding mask (B, 1, 1, S): B " + std::to_string(b.B) + ", S " + std::to_string(b.S);
    for (std::int32_t i = 0; i < b.B; ++i) {
        p.rows.push_back("sentence " + std::to_string(i + 1));
        std::vector<double> r;
        for (std::int32_t s = 0; s < b.S; ++s) r.push_back(hidden(pad.data()[i * b.S + s]));
        p.values.push_back(r);
    }
    for (std::int32_t s = 0; s < b.S; ++s) p.columns.push_back("key " + std::to_string(s));
    p.row_title = "sentence", p.column_title = "source position (key)";
    p.hover_text = [&](std::size_t r, std::size_t k) {
        const std::int32_t id = b.src[r * std::size_t(b.S) + k];
        return p.rows[r] + ", key " + std::to_string(k) + " '" + d.model.tokenizers.source->id_to_piece(id) + "': " + text(p.values[r][k]);
    };
    const std::string pad_svg = heatmap_svg(p);

    const Tensor causal = causal_mask(b.T);  // (1, 1, T, T)
    Heatmap c;
    c.id = "chart-mask-causal";
    c.title = "causal mask (1, 1, T, T): T " + std::to_string(b.T);
    for (std::int32_t q = 0; q < b.T; ++q) {
        c.rows.push_back("query " + std::to_string(q));
        c.columns.push_back("key " + std::to_string(q));
        std::vector<double> r;
        for (std::int32_t k = 0; k < b.T; ++k) r.push_back(hidden(causal.data()[q * b.T + k]));
        c.values.push_back(r);
    }
    c.hover_text = [&](std::size_t r, std::size_t k) { return c.rows[r] + ", " + c.columns[k] + ": " + text(c.values[r][k]); };
    c.row_title = "query", c.column_title = "key";
    const std::string causal_svg = heatmap_svg(c);

    // The decoder's combined mask for the shortest target of the batch: causal and padding together.
    std::size_t shortest = 0;
    for (std::size_t i = 1; i < ex.size(); ++i)
        if (b.tgt_len[i] < b.tgt_len[shortest]) shortest = i;
    const Tensor both = causal_padding_mask(b.dec_in, b.B, b.T, mc.pad_id);  // (B, 1, T, T)
    Heatmap cp;
    cp.id = "chart-mask-causal-padding";
    cp.title = "decoder mask of sentence " + std::to_string(shortest + 1) + " (causal + padding)";
    for (std::int32_t q = 0; q < b.T; ++q) {
        const std::string piece = d.model.tokenizers.target->id_to_piece(b.dec_in[shortest * std::size_t(b.T) + std::size_t(q)]);
        cp.rows.push_back(piece);
        cp.columns.push_back(piece);
        std::vector<double> r;
        for (std::int32_t k = 0; k < b.T; ++k) r.push_back(hidden(both.data()[(std::int64_t(shortest) * b.T + q) * b.T + k]));
        cp.values.push_back(r);
    }
    cp.row_title = "query", cp.column_title = "key";
    cp.hover_text = [&](std::size_t r, std::size_t k) {
        return "query " + std::to_string(r) + " '" + cp.rows[r] + "', key " + std::to_string(k) + ": " + text(cp.values[r][k]);
    };
    return para("Masks are added to the attention scores before the softmax: 0 keeps a key, −∞ hides it (dark = hidden). "
                "The padding mask hides the padding keys of shorter sentences in a batch; the causal mask hides the "
                "future from each decoder position; the decoder uses both. Built by key_padding_mask, causal_mask and "
                "causal_padding_mask (nn/attention.h) for a batch of sentences of different lengths from " +
                xml_escape(d.sentences_from) + "." +
                std::string(mc.causal_mask ? "" : " This model was trained without the causal mask (--no-causal-mask): its "
                                                  "decoder uses the padding mask only.")) +
           "<div class=\"row\">\n<figure>" + pad_svg + "</figure>\n<figure>" + causal_svg + "</figure>\n<figure>" +
           heatmap_svg(cp) + "</figure>\n</div>\n";
}

// q, the distribution the loss pulls p toward, read off the loss's own backward: for mean-reduced
// cross-entropy over n positions, ∂L/∂z = (softmax(z) − q)/n, so at logits z = 0, q = 1/V − n·∂L/∂z.
std::string label_smoothing_section(const RunData& d) {
    if (!d.model.model) return missing("no model (its vocabulary gives V): " + d.model_error);
    if (d.src.empty()) return missing(d.sentences_error.empty() ? "no sentences" : d.sentences_error);
    const ModelConfig& mc = d.model.model->config;
    const Tokenizer& tok = *d.model.tokenizers.target;
    std::vector<std::int32_t> target = tok.encode(!d.tgt.empty() && !d.tgt[0].empty() ? d.tgt[0] : d.src[0]);
    if (target.size() > 12) target.resize(12);
    target.push_back(mc.eos_id);
    const std::int64_t N = std::int64_t(target.size()), V = mc.tgt_vocab;
    const double eps = d.label_smoothing;
    Tensor logits = Tensor::zeros(Shape{N, V});  // (N, V)
    logits.set_requires_grad();
    Tensor loss = cross_entropy(logits, target, mc.pad_id, real(eps));
    backward(loss);
    const real* g = logits.grad();
    // Columns: the ids of the target, in order of first appearance, then a few others and pad.
    std::vector<std::int32_t> cols;
    for (std::int32_t id : target)
        if (std::find(cols.begin(), cols.end(), id) == cols.end()) cols.push_back(id);
    for (std::int32_t id = 0; id < V && cols.size() < std::size_t(std::min<std::int64_t>(V, std::int64_t(target.size()) + 6)); ++id)
        if (std::find(cols.begin(), cols.end(), id) == cols.end()) cols.push_back(id);
    Heatmap h;
    h.id = "chart-label-smoothing";
    h.title = "target distribution q, ε = " + num(eps) + ", V = " + std::to_string(V);
    for (std::int32_t id : cols) h.columns.push_back(tok.id_to_piece(id));
    for (std::int64_t t = 0; t < N; ++t) {
        h.rows.push_back("→ " + tok.id_to_piece(target[std::size_t(t)]));
        std::vector<double> r;
        for (std::int32_t id : cols) r.push_back(1.0 / double(V) - double(N) * double(g[t * V + id]));
        h.values.push_back(r);
    }
    h.hover_text = [&](std::size_t r, std::size_t k) { return h.rows[r] + ", entry '" + h.columns[k] + "': q = " + num(h.values[r][k], "%.6f"); };
    // ε/V is invisible on a linear colour scale: each cell prints its q.
    h.cell_numbers = true;
    h.cell_width = 44, h.cell_height = 30;  // room for "2e-04"
    h.row_title = "target position", h.column_title = "vocabulary entry";
    // The floor of the smoothed loss: the entropy of q (reached when p = q).
    const double on = 1 - eps + eps / double(V), off = eps / double(V);
    const double floor = -(on * std::log(on)) - (eps > 0 ? double(V - 1) * off * std::log(off) : 0);
    LineChart bars;  // one row of q, sorted: the shape of the smoothed target at a glance
    bars.id = "chart-label-smoothing-row";
    bars.title = "q over all V entries for one position, largest first";
    bars.x_label = "entry (sorted)";
    bars.y_label = "q";
    bars.log_y = eps > 0;  // the ε/V entries sit orders of magnitude below the right token's: a log axis shows both
    if (bars.log_y) bars.title += " (log scale)";
    LineSeries row = series("q", {}, {});
    std::vector<double> q0;
    for (std::int64_t v = 0; v < V; ++v) q0.push_back(1.0 / double(V) - double(N) * double(g[v]));
    std::sort(q0.rbegin(), q0.rend());
    for (std::int64_t v = 0; v < std::min<std::int64_t>(V, 40); ++v) row.x.push_back(double(v)), row.y.push_back(q0[std::size_t(v)]);
    row.markers = true;
    bars.series.push_back(row);
    return para("Label smoothing (ε = " + num(eps) + (d.label_smoothing_known ? ", from run.json" : ", the default") +
                ") trains toward q = (1 − ε)·onehot + ε/V instead of the one-hot target: the right token gets " + num(on, "%.4f") +
                ", every other of the V = " + std::to_string(V) + " entries " + num(off, "%.2e") +
                ". The values below are read off the loss's own backward (cross_entropy in ops.cpp: at zero logits q = 1/V − n·∂L/∂z), "
                "for the first sentence's target and the first entries of the vocabulary. The smoothed loss cannot go below the "
                "entropy of q, " + num(floor, "%.4f") + " nats per token.") +
           "<div class=\"row\">\n<figure>" + heatmap_svg(h) + "</figure>\n<figure>" + line_chart_svg(bars) + "</figure>\n</div>\n";
}

const char* kStyle =
    "body{font-family:sans-serif;margin:1em 2em;max-width:1400px;color:#222}"
    "nav a{margin-right:1em}section{border-top:1px solid #ccc;margin-top:1.5em}"
    ".row{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}figure{margin:0}"
    ".missing{color:#a00;font-style:italic}table{border-collapse:collapse}th,td{text-align:left;padding:2px 8px}"
    "th{color:#555;font-weight:normal}code{background:#f4f4f4}";

}  // namespace

std::string training_report_html(const std::string& dir, const ReportOptions& opt, std::vector<std::string>* problems) {
    const RunData d = load_run(dir, opt);
    if (problems) *problems = d.problems;
    // Each section drawn on its own: a malformed line in one file leaves the others' pictures.
    std::map<std::string, std::string> body;
    auto draw = [&](const char* id, const std::function<std::string()>& f) {
        try {
            body[id] = f();
        } catch (const std::exception& e) {
            body[id] = missing(std::string("could not draw this section: ") + e.what());
        }
    };
    draw("overview", [&] { return overview(d); });
    draw("loss", [&] { return loss_section(d); });
    draw("perplexity", [&] { return perplexity_section(d); });
    draw("learning-rate", [&] { return lr_section(d); });
    draw("bleu", [&] { return bleu_section(d); });
    draw("schedule", [&] { return schedule_section(d); });
    draw("grad-norms", [&] { return grad_norm_section(d); });
    draw("head-importance", [&] {
        return heads_section(d, opt, "importance", "chart-head-importance", 0, 1,
                             "Importance |⟨W_o^h, ∂L/∂W_o^h⟩|, normalised per layer (heads.h).");
    });
    draw("head-entropy", [&] {
        return heads_section(d, opt, "entropy_normalised", "chart-head-entropy", 0, 1,
                             "Attention entropy divided by ln(visible keys): 1 is uniform attention, 0 one key.");
    });
    draw("pruning", [&] { return pruning_section(d); });
    draw("attention", [&] { return attention_section(d); });
    draw("positional", [&] { return positional_section(d); });
    draw("masks", [&] { return masks_section(d); });
    draw("label-smoothing", [&] { return label_smoothing_section(d); });
    std::ostringstream o;
    const std::string title = "tapeformer training report: " + dir;
    // default-src 'none': the page may load nothing at all (no script, image, font, frame or connection);
    // only its own <style> element is allowed.
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
      << "<title>" << xml_escape(title) << "</title>\n<style>" << kStyle << "</style></head><body>\n"
      << "<h1>" << xml_escape(title) << "</h1>\n<nav>";
    for (const ReportSection& s : report_sections()) o << "<a href=\"#" << s.id << "\">" << s.title << "</a>";
    o << "</nav>\n";
    for (const ReportSection& s : report_sections()) {
        const std::string& html = body.at(s.id);
        const bool has_data = html.find("<svg") != std::string::npos || (std::string(s.id) == "overview" && d.run.has_value());
        o << "<section id=\"" << s.id << "\" data-state=\"" << (has_data ? "drawn" : "missing") << "\">\n<h2>" << s.title
          << "</h2>\n" << html << "</section>\n";
    }
    o << "</body></html>\n";
    return o.str();
}

TF_NAMESPACE_END
