// `tapeformer attention`: the attention maps of one sentence (attention_maps.h) as JSON for bertviz, a
// self-contained HTML page and one SVG file per heatmap.
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "tapeformer/study/attention_maps.h"
#include "tapeformer/run/checkpoint.h"
#include "cli/commands.h"
#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

namespace {

struct AttentionCommandOptions {
    std::string model_dir, src, tgt, json, html, view, svg_dir, mask;
    std::vector<int> layers, heads;
    MapStyle style;  // --cell-px, --numbers
    DecodeOptions decode;
    std::int64_t batch_tokens = 4096;  // unused: add_decode_options wants it
};

}  // namespace

void add_attention_command(CLI::App& app) {
    auto opt = std::make_shared<AttentionCommandOptions>();
    CLI::App* cmd = app.add_subcommand(
        "attention",
        "The attention weights of every head for one sentence: JSON ([layer][head][query][key], tokens; see\n"
        "docs/heads.md for the two lines bertviz needs), a self-contained HTML page of heatmaps (inline SVG, no\n"
        "network) and one SVG file per heatmap. Without --tgt the target is decoded greedily first.\n"
        "Example: tapeformer attention --model runs/toy --src \"the dog sees a cat .\" --html att.html");
    cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train`")->required();
    cmd->add_option("--src", opt->src, "The source sentence")->required();
    cmd->add_option("--tgt", opt->tgt, "The target sentence (default: the model's greedy translation)");
    cmd->add_option("--json", opt->json, "Write the maps as JSON here (default: standard output, unless --html/--view/--svg-dir)");
    cmd->add_option("--html", opt->html, "Write a self-contained HTML page of heatmaps here");
    cmd->add_option("--view", opt->view,
                    "Write bertviz's head view here: one offline HTML page, kind/layer/head selectors, hover or click a\n"
                    "token for its lines and weights (example: --src \"the dog sees a cat .\" --view view.html)");
    cmd->add_option("--svg-dir", opt->svg_dir, "Write one SVG file per heatmap into this directory (created if needed)");
    cmd->add_option("--layers", opt->layers, "Only these layers in the HTML and SVG files (0-based; default all)")->delimiter(',');
    cmd->add_option("--heads", opt->heads, "Only these heads in the HTML and SVG files (0-based; default all)")->delimiter(',');
    cmd->add_option("--cell-px", opt->style.cell_px,
                    "Pixels per heatmap cell in the HTML and SVG files (larger for a projector)")
        ->check(number_above(4, false))
        ->capture_default_str();
    cmd->add_flag("--numbers", opt->style.numbers, "Print each weight in its cell (for small maps)");
    add_mask_heads_option(*cmd, opt->mask);
    add_decode_options(*cmd, opt->decode, opt->batch_tokens);
    cmd->callback([opt, cmd]() {
        if (!opt->json.empty()) check_output_path(opt->json, "--json", {opt->model_dir});
        if (!opt->html.empty()) check_output_path(opt->html, "--html", {opt->model_dir});
        if (!opt->view.empty()) check_output_path(opt->view, "--view", {opt->model_dir});
        if (!opt->svg_dir.empty() && std::filesystem::exists(opt->svg_dir) && !std::filesystem::is_directory(opt->svg_dir))
            throw std::runtime_error("--svg-dir '" + opt->svg_dir + "' is a file; expected a directory");
        ModelBundle bundle = load_model_dir(opt->model_dir);
        const ModelConfig& c = bundle.model->config;
        const std::int64_t layers = c.decoder_only() ? c.dec_layers : std::max(c.enc_layers, c.dec_layers);
        for (int l : opt->layers)
            if (l < 0 || l >= int(layers))
                throw std::runtime_error("--layers: the model has layers 0.." + std::to_string(layers - 1) +
                                         ", got " + std::to_string(l));
        for (int h : opt->heads)
            if (h < 0 || h >= int(c.heads))
                throw std::runtime_error("--heads: the model has heads 0.." + std::to_string(c.heads - 1) + ", got " + std::to_string(h));
        apply_mask_heads(*bundle.model, opt->mask);
        const bool has_tgt = cmd->count("--tgt") > 0;
        const AttentionMaps maps = attention_maps(*bundle.model, bundle.tokenizers, opt->src, has_tgt ? &opt->tgt : nullptr, opt->decode);
        const MapFilter filter{opt->layers, opt->heads};
        StudyProvenance made_from = study_provenance(bundle, opt->model_dir);
        made_from.data = {opt->src};
        if (has_tgt) made_from.data.push_back(opt->tgt);
        made_from.pairs_read = made_from.pairs_used = 1;
        if (!opt->json.empty()) {
            write_file_atomic(opt->json, attention_json(maps, made_from));
            std::cerr << "wrote " << opt->json << "\n";
        }
        if (!opt->html.empty()) {
            write_file_atomic(opt->html, attention_html(maps, filter, "Attention of " + opt->model_dir, opt->style));
            std::cerr << "wrote " << opt->html << "\n";
        }
        if (!opt->view.empty()) {
            write_file_atomic(opt->view, attention_view(maps, "Attention of " + opt->model_dir));
            std::cerr << "wrote " << opt->view << "\n";
        }
        if (!opt->svg_dir.empty()) {
            std::filesystem::create_directories(opt->svg_dir);
            const auto files = attention_svg_files(maps, filter, opt->style);
            for (const auto& [name, svg] : files)
                write_file_atomic((std::filesystem::path(opt->svg_dir) / name).string(), svg);
            std::cerr << "wrote " << files.size() << " SVG heatmaps to " << opt->svg_dir << "\n";
        }
        if (opt->json.empty() && opt->html.empty() && opt->view.empty() && opt->svg_dir.empty()) std::cout << attention_json(maps, made_from);
        else if (maps.decoded) {
            std::string t;
            for (std::size_t i = 1; i < maps.tgt_in.size(); ++i) t += (i > 1 ? " " : "") + maps.tgt_in[i];
            std::cerr << "greedy translation: " << t << "\n";
        }
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
