// Pruned models that are really smaller (prune.h remove_heads, heads prune --save, train --init-from): the
// model with heads removed computes what the masked model computes, its gradients are the masked model's
// for the weights it keeps, its head counts travel in the weights file, and the CLI writes it without
// touching anything of the user's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "head_fixtures.h"
#include "helpers.h"
#include "tapeformer/autograd.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/study/head_ids.h"
#include "tapeformer/study/prune.h"

using namespace tf_test;

namespace {

// logits (B, T, V) of the model on a batch of random pairs, evaluation mode; `fused`: training's fused attention.
tf::Tensor logits_of(tf::Transformer& model, const tf::Batch& b, bool fused = false) {
    tf::Pass pass;
    pass.fuse_attention = fused;
    return model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);
}

// max |a − b| over max |a|: the two models' outputs agree to rounding when this is ~1e-7.
double relative_gap(const tf::Tensor& a, const tf::Tensor& b) {
    REQUIRE(a.shape() == b.shape());
    double gap = 0, scale = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        gap = std::max(gap, std::abs(double(a.data()[i]) - double(b.data()[i])));
        scale = std::max(scale, std::abs(double(a.data()[i])));
    }
    return gap / scale;
}

tf::Batch random_batch(std::uint64_t seed) {
    const std::vector<tf::Example> examples = random_examples(6, seed);
    std::vector<std::int64_t> rows(examples.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = std::int64_t(i);
    return tf::make_batch(examples, rows);
}

std::vector<tf::HeadId> heads(const std::string& spec, const tf::ModelConfig& c) { return tf::parse_head_list(spec, c); }

double max_abs(const tf::Tensor& t) {
    double m = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.data()[i])));
    return m;
}

}  // namespace

TEST_CASE("remove_heads: the smaller model computes what the masked model computes", "[heads][prune][removal]") {
    struct Case {
        tf::AttentionScore attention;
        std::int64_t window;
        tf::NormPosition norm;
        const char* removed;
    };
    // A:0 loses every head (it keeps head 0, zeroed); E:1 loses three of four.
    const Case cases[] = {{tf::AttentionScore::Dot, 0, tf::NormPosition::Post, "E:0:1,E:1:0,E:1:2,E:1:3,D:0:2,A:0:0,A:0:1,A:0:2,A:0:3"},
                          {tf::AttentionScore::Additive, 0, tf::NormPosition::Pre, "E:0:0,E:0:3,D:0:1,A:0:2"},
                          {tf::AttentionScore::Linear, 0, tf::NormPosition::Post, "E:1:1,D:0:0,D:0:3,A:0:1"},
                          {tf::AttentionScore::Local, 2, tf::NormPosition::Pre, "E:0:2,D:0:0,D:0:1,D:0:2"}};
    for (const Case& k : cases) {
        INFO(tf::to_string(k.attention) << " attention, removing " << k.removed);
        tf::ModelConfig c = tiny_head_model();
        c.attention = k.attention;
        c.window = k.window;
        c.norm = k.norm;
        tf::Transformer model(c, 7);
        const std::vector<tf::HeadId> removed = heads(k.removed, c);
        const tf::Batch b = random_batch(11);
        tf::NoGradGuard no_grad;
        tf::mask_heads(model, removed);
        const tf::Tensor masked = logits_of(model, b);
        const tf::HeadRemoval r = tf::remove_heads(model, removed);
        tf::Transformer& small = *r.model;

        // Its structure: H_l heads of the same D in every attention, the weights cut to them.
        const std::int64_t D = c.d_model / c.heads, C = c.d_model;
        std::int64_t gone = 0;  // heads removed and not kept zeroed
        for (tf::HeadKind kind : tf::kHeadKinds)
            for (int l = 0; l < tf::layers_of(c, kind); ++l) {
                int listed = 0;
                for (const tf::HeadId& h : removed) listed += h.kind == kind && h.layer == l;
                const int kept = std::max(1, int(c.heads) - listed);
                gone += int(c.heads) - kept;
                const tf::MultiHeadAttention& m = tf::attention_of(small, kind, l);
                CHECK(m.H == kept);
                CHECK(m.D == D);
                CHECK(m.in_proj_weight.shape() == tf::Shape({3 * kept * D, C}));
                CHECK(m.out_proj.weight.shape() == tf::Shape({C, kept * D}));
                CHECK(tf::heads_of(small.config, kind, l) == kept);
            }
        CHECK(r.zeroed.size() == (std::string(k.removed).find("A:0:3") != std::string::npos ? 1u : 0u));
        const std::int64_t per_head = 4 * D * C + 3 * D + (k.attention == tf::AttentionScore::Additive ? D : 0);
        CHECK(small.parameter_count() == model.parameter_count() - gone * per_head);

        // Its output: the masked model's, to rounding (the masked heads' terms left out of W_o's sums instead
        // of multiplied by 0), composed and, where it applies, fused.
        CHECK(relative_gap(masked, logits_of(small, b)) < 1e-5);
        CHECK(relative_gap(masked, logits_of(small, b, true)) < 1e-5);
        CHECK(max_abs(masked) > 0.1);
    }
}

TEST_CASE("remove_heads: a kept head's gate is folded into W_o, and the gradients are the masked model's",
          "[heads][prune][removal]") {
    const tf::ModelConfig c = tiny_head_model();
    tf::Transformer model(c, 3);
    const std::vector<tf::HeadId> removed = heads("E:0:1,D:0:3,A:0:0,A:0:2", c);
    tf::mask_heads(model, removed);
    tf::attention_of(model, tf::HeadKind::E, 0).gate.data()[2] = tf::real(0.5);   // L0's evaluation gates are fractions
    tf::attention_of(model, tf::HeadKind::A, 0).gate.data()[3] = tf::real(0.25);
    const tf::HeadRemoval r = tf::remove_heads(model, removed);
    const tf::Batch b = random_batch(5);
    {
        tf::NoGradGuard no_grad;
        CHECK(relative_gap(logits_of(model, b), logits_of(*r.model, b)) < 1e-5);
    }
    // Fine-tuning the smaller model is fine-tuning the masked one: with every gate 0 or 1, the loss's
    // gradient of each kept head's rows of in_proj is the masked model's (its removed rows get 0 there).
    tf::mask_heads(model, removed);
    const tf::HeadRemoval plain = tf::remove_heads(model, removed);
    for (tf::Transformer* m : {&model, plain.model.get()}) {  // fresh models: the gradients start at none
        tf::Tensor loss = tf::sequence_loss(logits_of(*m, b), b.target, c.pad_id, tf::real(0.1));
        tf::backward(loss);
    }
    const std::int64_t D = c.d_model / c.heads, C = c.d_model;
    for (tf::HeadKind kind : tf::kHeadKinds)
        for (int l = 0; l < tf::layers_of(c, kind); ++l) {
            const tf::MultiHeadAttention& a = tf::attention_of(model, kind, l);
            const tf::MultiHeadAttention& s = tf::attention_of(*plain.model, kind, l);
            int j = 0;
            for (int h = 0; h < int(c.heads); ++h) {
                if (std::find(removed.begin(), removed.end(), tf::HeadId{kind, l, h}) != removed.end()) continue;
                INFO((tf::HeadId{kind, l, h}.str()));
                double gap = 0, scale = 0;
                for (std::int64_t part = 0; part < 3; ++part)
                    for (std::int64_t i = 0; i < D * C; ++i) {
                        const double want = a.in_proj_weight.grad()[(part * c.heads * D + h * D) * C + i];
                        const double got = s.in_proj_weight.grad()[(part * s.H * D + j * D) * C + i];
                        gap = std::max(gap, std::abs(want - got));
                        scale = std::max(scale, std::abs(want));
                    }
                CHECK(scale > 0);
                CHECK(gap <= 1e-5 * scale);
                ++j;
            }
        }
}

TEST_CASE("head counts: stored in the weights file's metadata as text, read back, malformed text refused",
          "[heads][prune][removal][settings]") {
    tf::ModelConfig c = tiny_head_model();
    CHECK(c.head_counts_text().empty());
    c.set_head_counts("E:1,4;D:2;A:3");
    CHECK(c.enc_self_heads == std::vector<std::int64_t>{1, 4});
    CHECK(c.heads_in('D', 0) == 2);
    CHECK(c.heads_in('A', 0) == 3);
    CHECK(c.head_width() == 4);
    CHECK_NOTHROW(c.validate());
    const tf::ModelConfig back = tf::model_config_from_metadata(tf::to_metadata(c));
    CHECK(back.head_counts_text() == "E:1,4;D:2;A:3");
    auto refused = [&](const std::string& text, const std::string& says) {
        tf::ModelConfig m = tiny_head_model();
        std::map<std::string, std::string> metadata = tf::to_metadata(m);
        metadata["head_counts"] = text;
        try {
            tf::ModelConfig read = tf::model_config_from_metadata(metadata);
            read.validate();
            FAIL("accepted head_counts '" << text << "'");
        } catch (const std::invalid_argument& e) {
            CHECK_THAT(e.what(), Catch::Contains(says));
        }
    };
    refused("E:1,x", "'x' is not a head count");
    refused("Q:1", "KIND E, D or A");
    refused("E:1;E:2", "E is listed twice");
    refused("E:1", "head_counts E lists 1 layers, but the model has 2");
    refused("E:1,5", "keeps 1 to heads (4)");
    refused("D:0", "keeps 1 to heads");
}

TEST_CASE("heads prune --save: a smaller model every command loads, its NLL the masked model's, train --init-from "
          "fine-tunes it; nothing of the user's replaced",
          "[heads][prune][removal][cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string model = train_tiny_model(tmp, 3);  // 1+1 layers, 2 heads
    {
        std::ofstream src(tmp / "s"), ref(tmp / "r");
        const auto s = split_lines(read_all(toy + "test.src")), r = split_lines(read_all(toy + "test.tgt"));
        for (int i = 0; i < 20; ++i) src << s[i] << "\n", ref << r[i] << "\n";
    }
    const std::string pairs = " --src " + shell_quote(tmp / "s") + " --ref " + shell_quote(tmp / "r");
    const std::string prune = "heads prune --model " + shell_quote(model) + pairs + " --order random --step 50%";
    const std::string out = tmp / "pruned";
    const Run saved = run_cli(tmp, prune + " --save " + shell_quote(out) + " --save-at 60%");
    REQUIRE(saved.status == 0);
    CHECK_THAT(saved.out, Catch::Contains("saved " + out + ": 3 heads removed"));

    const nlohmann::json record = nlohmann::json::parse(read_all(out + "/pruning.json"));
    CHECK(record["fraction"] == 0.5);  // 3 of the 3 attentions' 6 heads: the last point at or below 60%
    CHECK(record["removed"].size() == 3);
    CHECK(record["made_from"]["model"] == model);
    CHECK(std::abs(record["nll_removed"].get<double>() - record["nll_masked"].get<double>()) <=
          1e-5 * record["nll_masked"].get<double>());
    CHECK(record["parameters_after"].get<std::int64_t>() < record["parameters_before"].get<std::int64_t>());

    // Every command reads it: eval's NLL is the one pruning.json recorded for the masked model.
    tf::ModelBundle bundle = tf::load_model_dir(out);
    CHECK(bundle.model->config.heads_removed());
    CHECK(bundle.model->config.head_counts_text() == record["head_counts"].get<std::string>());
    CHECK(run_cli(tmp, "eval --model " + shell_quote(out) + pairs).status == 0);
    CHECK_THAT(run_cli(tmp, "translate --timing --model " + shell_quote(out) + " --input " + shell_quote(tmp / "s") + " --output " +
                                shell_quote(tmp / "t")).err,
               Catch::Contains("tokens/s"));
    CHECK(run_cli(tmp, "heads --model " + shell_quote(out) + " --src " + shell_quote(tmp / "s") + " --tgt " + shell_quote(tmp / "r") +
                           " --out " + shell_quote(tmp / "study"))
              .status == 0);

    // Fine-tuning starts from it: its settings, weights and tokenizer.
    const Run tuned = run_cli(tmp, "train --init-from " + shell_quote(out) + " --train-src " +
                                            shell_quote(toy + "valid.src") + " --train-tgt " + shell_quote(toy + "valid.tgt") +
                                            " --max-steps 2 --out " + shell_quote(tmp / "tuned"));
    REQUIRE(tuned.status == 0);
    CHECK_THAT(tuned.out + tuned.err, Catch::Contains("initialised from " + out));
    CHECK(tf::load_model_dir(tmp / "tuned").model->config.head_counts_text() == record["head_counts"].get<std::string>());
    CHECK(read_all(tmp / "tuned/vocab.txt") == read_all(out + "/vocab.txt"));

    // Refused before any work, leaving every file as it was.
    const std::string before = read_all(out + "/model.safetensors");
    auto refused = [&](const std::string& args, const std::string& says) {
        const Run r = run_cli(tmp, prune + args);
        CHECK(r.status != 0);
        CHECK_THAT(r.err, Catch::Contains(says));
    };
    refused(" --save " + shell_quote(out), "is not empty; give --force");
    refused(" --save " + shell_quote(model), "holds a training run");
    refused(" --save-at 50%", "--save-at picks the point --save writes; give --save DIR");
    refused(" --model " + shell_quote(out) + " --save " + shell_quote(tmp / "two"), "give one --model (got 2)");
    CHECK(read_all(out + "/model.safetensors") == before);
    CHECK(run_cli(tmp, prune + " --save " + shell_quote(out) + " --force --save-at 0").status == 0);  // an earlier one: replaced
    CHECK(!tf::load_model_dir(out).model->config.heads_removed());
}
