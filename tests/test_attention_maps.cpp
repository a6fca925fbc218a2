// tapeformer attention (attention_maps.h): the maps are the model's weights (rows sum to 1, the causal
// mask leaves the future at exactly 0), the tokens label them, the page and the SVG files hold one heatmap
// per selected head and fetch nothing, and bad input is one line.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tapeformer/study/attention_maps.h"
#include "tapeformer/run/checkpoint.h"
#include "helpers.h"

using namespace tf_test;

namespace {

// A model trained for a few steps on the toy corpus, in a temp dir, once for this file.
const std::string& toy_model() {
    static TempDir dir("attention");
    static const std::string model = [] {
        const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
        const std::string m = dir / "model";
        const std::string cmd = shell_quote(TF_CLI) + " --threads 1 train --train-src " + shell_quote(toy + "valid.src") +
                                " --train-tgt " + shell_quote(toy + "valid.tgt") +
                                " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --enc-layers 2" +
                                " --dec-layers 1 --max-steps 5 --out " + shell_quote(m) + " >/dev/null 2>&1";
        if (std::system(cmd.c_str()) != 0) throw std::runtime_error("training the test model failed");
        return m;
    }();
    return model;
}

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

}  // namespace

TEST_CASE("attention maps: shapes follow the tokens, rows sum to 1, the decoder never looks ahead", "[attention_maps]") {
    tf::ModelBundle bundle = tf::load_model_dir(toy_model());
    const std::string tgt = "lo karo videt .";
    const tf::AttentionMaps m = tf::attention_maps(*bundle.model, bundle.tokenizers, "the dog sees .", &tgt);
    CHECK(m.src == std::vector<std::string>{"the", "dog", "sees", ".", "</s>"});
    CHECK(m.tgt_in.front() == "<s>");
    CHECK(m.tgt_out.back() == "</s>");
    REQUIRE(m.encoder_self.size() == 2);
    REQUIRE(m.decoder_self.size() == 1);
    REQUIRE(m.cross.size() == 1);
    const std::size_t S = m.src.size(), T = m.tgt_in.size();
    for (const auto* maps : {&m.encoder_self, &m.decoder_self, &m.cross})
        for (const auto& layer : *maps) {
            REQUIRE(layer.size() == 2);
            for (const auto& head : layer)
                for (const auto& row : head) {
                    double sum = 0;
                    for (double w : row) sum += w;
                    CHECK(sum == Approx(1.0).epsilon(1e-5));
                }
        }
    CHECK(m.encoder_self[0][0].size() == S);
    CHECK(m.cross[0][1].size() == T);
    CHECK(m.cross[0][1][0].size() == S);
    for (std::size_t q = 0; q < T; ++q)
        for (std::size_t k = q + 1; k < T; ++k) CHECK(m.decoder_self[0][1][q][k] == 0.0);
    tf::StudyProvenance made_from;
    made_from.model = "runs/x";
    made_from.masked_heads = {"E:0:1"};
    const auto j = nlohmann::json::parse(tf::attention_json(m, made_from));
    CHECK(j.at("made_from").at("model") == "runs/x");
    CHECK(j.at("made_from").at("masked_heads") == nlohmann::json::array({"E:0:1"}));
    CHECK(j.at("tokens").at("src").size() == S);
    CHECK(j.at("encoder_self")[1][0][2][3].get<double>() == m.encoder_self[1][0][2][3]);
}

TEST_CASE("attention maps: a greedy target that runs to the length cap still fits the model's positions",
          "[attention_maps]") {
    // An untrained model whose output bias always prefers "karo": greedy decoding never ends by EOS and runs
    // to the cap. The maps' teacher-forced pass reads BOS + target, so the target may hold max_len - 1 tokens.
    const std::vector<std::string> src = {"a dog"}, tgt = {"lo karo"};
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    options.joint = true;
    const tf::TokenizerPair tokenizers = tf::TokenizerPair::train(src, tgt, options);
    tf::ModelConfig c = tiny_model_config(tokenizers.source->vocab_size(), 8, 2, 16, 1, 1, /*max_len=*/8);
    c.output_bias = true;
    tf::Transformer model(c, /*seed=*/3);
    const std::int32_t karo = tokenizers.target->piece_to_id("karo");
    model.generator_bias.data()[karo] = 100;
    const tf::AttentionMaps m = tf::attention_maps(model, tokenizers, "a dog", nullptr);
    CHECK(m.decoded);
    CHECK(std::int64_t(m.tgt_in.size()) == c.max_len);  // BOS + max_len - 1 pieces, each "karo"
    CHECK(m.tgt_in.back() == "karo");
    REQUIRE(m.cross.size() == 1);
    CHECK(std::int64_t(m.cross[0][0].size()) == c.max_len);
}

TEST_CASE("attention maps: the command writes the page and one SVG per selected head, nothing is fetched",
          "[attention_maps][cli]") {
    TempDir tmp;
    const std::string cmd = shell_quote(TF_CLI) + " --threads 1 attention --model " + shell_quote(toy_model()) +
                            " --src 'the dog sees a cat .' --html " + shell_quote(tmp / "a.html") + " --svg-dir " +
                            shell_quote(tmp / "svg") + " --json " + shell_quote(tmp / "a.json") + " --heads 1 2>" +
                            shell_quote(tmp / "err");
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string html = read_all(tmp / "a.html");
    CHECK(count(html, "<svg ") == 4);  // head 1 of E:0, E:1, D:0 and A:0
    CHECK(count(html, "http") == count(html, "http://www.w3.org/2000/svg"));  // no other address: nothing to fetch
    CHECK(count(html, "<script") == 0);
    CHECK(std::filesystem::exists(tmp / "svg/E-layer1-head1.svg"));
    CHECK_FALSE(std::filesystem::exists(tmp / "svg/E-layer1-head0.svg"));
    CHECK(nlohmann::json::parse(read_all(tmp / "a.json")).at("target_decoded") == true);
    CHECK_THAT(read_all(tmp / "err"), Catch::Contains("greedy translation:"));
    // Each head's figure holds its own picture: its title, query/key axis titles and a colour bar inside it,
    // no caption below it (which would read as the next map's title); cells of 28 px by default.
    CHECK(count(html, "<figcaption") == 0);
    for (std::size_t at = html.find("<figure"); at != std::string::npos; at = html.find("<figure", at + 1)) {
        const std::string figure = html.substr(at, html.find("</figure>", at) - at);
        CHECK(count(figure, "<svg ") == 1);
        CHECK(count(figure, "class=\"map-title\"") == 1);
        CHECK(count(figure, "class=\"colour-bar\"") == 1);
        CHECK(count(figure, ">query</text>") == 1);
        CHECK(count(figure, ">key →</text>") == 1);
    }
    CHECK(count(html, "width=\"28\" height=\"28\"") > 0);
    CHECK(count(html, "class=\"cell-value\"") == 0);

    // --cell-px and --numbers: a map a projector shows, each weight written in its cell.
    const std::string big = shell_quote(TF_CLI) + " --threads 1 attention --model " + shell_quote(toy_model()) +
                            " --src 'the dog sees a cat .' --cell-px 40 --numbers --layers 0"
                            " --heads 0 --html " + shell_quote(tmp / "big.html") + " 2>" + shell_quote(tmp / "err");
    REQUIRE(std::system(big.c_str()) == 0);
    const std::string big_html = read_all(tmp / "big.html");
    CHECK(count(big_html, "width=\"28\" height=\"28\"") == 0);
    const std::size_t cells = count(big_html, "width=\"40\" height=\"40\"");
    CHECK(cells > 0);
    CHECK(count(big_html, "class=\"cell-value\"") == cells);  // one number per cell

    for (const std::string bad : {" --src ''", " --src 'a dog .' --heads 5", " --src 'a dog .' --cell-px 2"}) {
        const std::string run = shell_quote(TF_CLI) + " attention --model " + shell_quote(toy_model()) + bad + " >/dev/null 2>" +
                                shell_quote(tmp / "err");
        CHECK(std::system(run.c_str()) != 0);
        CHECK(split_lines(read_all(tmp / "err")).size() == 1);
    }
}

TEST_CASE("attention view: the page embeds the maps as JSON, forbids fetching, escapes tokens, flags masked heads",
          "[attention_maps][cli]") {
    TempDir tmp;
    const std::string cmd = shell_quote(TF_CLI) + " --threads 1 attention --model " + shell_quote(toy_model()) +
                            " --src 'the dog sees a cat .' --mask-heads E:1:0 --json " + shell_quote(tmp / "a.json") +
                            " --view " + shell_quote(tmp / "v.html") + " 2>" + shell_quote(tmp / "err");
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string page = read_all(tmp / "v.html");
    CHECK_THAT(page, Catch::Contains("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';"));
    const std::string open_tag = "<script type=\"application/json\" id=\"maps\">";
    const std::size_t from = page.find(open_tag) + open_tag.size();
    REQUIRE(from > open_tag.size());
    const nlohmann::json embedded = nlohmann::json::parse(page.substr(from, page.find("</script>", from) - from));
    const nlohmann::json maps = nlohmann::json::parse(read_all(tmp / "a.json"));
    for (const char* kind : {"encoder_self", "decoder_self", "cross"}) CHECK(embedded.at(kind) == maps.at(kind));
    CHECK(embedded.at("tokens") == maps.at("tokens"));
    CHECK(embedded.at("masked") == nlohmann::json::array({"E:1:0"}));

    // Token text that could close the script or open a tag stays data: only \u escapes inside the JSON.
    tf::AttentionMaps odd;
    odd.src = {"</script><b>&\"'", "</s>"};
    odd.encoder_self = {{{{0.25, 0.75}, {1.0, 0.0}}}};
    const std::string odd_page = tf::attention_view(odd, "a <title> & \"quotes\"");
    CHECK(count(odd_page, "</script>") == 2);  // the JSON's and the script's own
    CHECK(count(odd_page, "<b>") == 0);
    CHECK_THAT(odd_page, Catch::Contains("<title>a &lt;title&gt; &amp; &quot;quotes&quot;</title>"));
    const std::size_t at = odd_page.find(open_tag) + open_tag.size();
    const nlohmann::json back = nlohmann::json::parse(odd_page.substr(at, odd_page.find("</script>", at) - at));
    CHECK(back.at("tokens").at("src").at(0) == "</script><b>&\"'");
}
