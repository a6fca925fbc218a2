// tapeformer tape (tape_view.h): the graph is the tape's records in order, backward visits them in reverse,
// the gradients it shows are the model's, the DOT output is well-formed Graphviz (parsed here statement by
// statement; rendered with `dot` when installed), and gradients accumulate over two backward passes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "tapeformer/teach/tape_view.h"
#include "helpers.h"

using namespace tf_test;

namespace {

// A structural check of the DOT that tape_dot writes: one statement per line, quoted strings closed,
// record labels with balanced (unescaped) braces, clusters balanced, every edge between declared nodes.
struct DotSummary {
    std::set<std::string> nodes;
    std::vector<std::pair<std::string, std::string>> edges;
    std::vector<std::string> cluster_labels;
    std::map<std::string, std::string> labels, fills;
};

// key=value pairs of an attribute list "a=b, c=\"...\"" -> map; throws on a malformed list.
std::map<std::string, std::string> parse_attrs(const std::string& s) {
    std::map<std::string, std::string> out;
    std::size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
        if (i >= s.size()) break;
        const std::size_t eq = s.find('=', i);
        if (eq == std::string::npos) throw std::runtime_error("attribute without '=': " + s.substr(i));
        const std::string key = s.substr(i, eq - i);
        std::string value;
        i = eq + 1;
        if (i < s.size() && s[i] == '"') {
            ++i;
            while (i < s.size() && s[i] != '"') {
                if (s[i] == '\\') {
                    if (i + 1 >= s.size()) throw std::runtime_error("dangling escape");
                    value += s[i];
                    ++i;
                }
                value += s[i++];
            }
            if (i >= s.size()) throw std::runtime_error("unterminated string in: " + s);
            ++i;
        } else {
            while (i < s.size() && s[i] != ',') value += s[i++];
        }
        out[key] = value;
    }
    return out;
}

bool record_braces_balanced(const std::string& label) {
    int depth = 0;
    for (std::size_t i = 0; i < label.size(); ++i) {
        if (label[i] == '\\') {
            ++i;
            continue;
        }
        if (label[i] == '{') ++depth;
        if (label[i] == '}' && --depth < 0) return false;
    }
    return depth == 0;
}

DotSummary parse_dot(const std::string& dot) {
    const std::vector<std::string> lines = split_lines(dot);
    REQUIRE(lines.size() > 2);
    REQUIRE(lines.front() == "digraph tape {");
    REQUIRE(lines.back() == "}");
    DotSummary d;
    int depth = 1;
    for (std::size_t k = 1; k + 1 < lines.size(); ++k) {
        std::string l = lines[k];
        l = l.substr(l.find_first_not_of(' '));
        INFO("line " << k + 1 << ": " << l);
        if (l.rfind("subgraph cluster_", 0) == 0) {
            REQUIRE(l.back() == '{');
            ++depth;
            continue;
        }
        if (l == "}") {
            --depth;
            REQUIRE(depth >= 1);
            continue;
        }
        REQUIRE(l.back() == ';');
        l.pop_back();
        const std::size_t arrow = l.find(" -> ");
        const std::size_t bracket = l.find(" [");
        if (arrow != std::string::npos && (bracket == std::string::npos || arrow < bracket)) {
            d.edges.push_back({l.substr(0, arrow), l.substr(arrow + 4)});
        } else if (bracket != std::string::npos) {
            REQUIRE(l.back() == ']');
            const std::string id = l.substr(0, bracket);
            const auto attrs = parse_attrs(l.substr(bracket + 2, l.size() - bracket - 3));
            if (id == "node") continue;
            REQUIRE(d.nodes.insert(id).second);  // declared once
            REQUIRE(attrs.count("label"));
            if (attrs.count("shape") && attrs.at("shape") == "record") REQUIRE(record_braces_balanced(attrs.at("label")));
            d.labels[id] = attrs.at("label");
            if (attrs.count("fillcolor")) d.fills[id] = attrs.at("fillcolor");
        } else {
            const auto attrs = parse_attrs(l);  // a graph attribute: label=..., rankdir=..., style=...
            REQUIRE(attrs.size() == 1);
            if (depth == 2 && attrs.count("label")) d.cluster_labels.push_back(attrs.at("label"));
        }
    }
    REQUIRE(depth == 1);
    for (const auto& [a, b] : d.edges) {
        CHECK(d.nodes.count(a));
        CHECK(d.nodes.count(b));
    }
    return d;
}

struct TinyModel {
    tf::Transformer model{tf::tiny_tape_config(12), 5};
    std::vector<std::int32_t> src{4, 5, 6}, tgt{6, 5, 4, 7};
};

}  // namespace

TEST_CASE("tape: records in order, backward in reverse, the gradients shown are the model's", "[tape][autograd]") {
    TinyModel t;
    const tf::TapeGraph g = tf::record_training_step(t.model, t.src, t.tgt, {});
    REQUIRE(g.ops.size() > 40);
    CHECK(g.ops.front().op == "embedding");
    CHECK(g.ops.back().op == "cross_entropy");
    CHECK(g.tensors[g.ops.back().output].kind == tf::TapeTensor::Kind::Loss);
    CHECK(g.tensors[g.ops.back().output].shape == tf::Shape{});
    // Every op's inputs were made before it: the recorded order is a topological order.
    for (std::size_t r = 0; r < g.ops.size(); ++r)
        for (int in : g.ops[r].inputs) CHECK(g.tensors[in].record < int(r));
    // backward visits each record once, last recorded first.
    REQUIRE(g.backward_order.size() == g.ops.size());  // every record here is on the loss's path
    for (std::size_t i = 0; i < g.backward_order.size(); ++i) CHECK(g.backward_order[i] == int(g.ops.size() - 1 - i));
    // Parameter nodes carry the model's real gradients (the model keeps the step's gradients).
    int params = 0;
    for (const auto& n : g.tensors) {
        if (n.kind != tf::TapeTensor::Kind::Parameter || n.name.find('[') != std::string::npos) continue;
        for (const auto& p : t.model.parameters())
            if (p.name == n.name) {
                ++params;
                double s = 0;
                for (float v : p.tensor.grad_vector()) s += double(v) * v;
                CHECK(n.has_grad);
                CHECK(n.grad_norm == Approx(std::sqrt(s)).epsilon(1e-6));
            }
    }
    CHECK(params >= 20);
    // The fused projection's rows appear under their own names: W_q of cross-attention is rows [0, C).
    bool saw_rows = false;
    for (const auto& n : g.tensors) saw_rows = saw_rows || n.name == "decoder.layers.0.multihead_attn.in_proj_weight[0:8]";
    CHECK(saw_rows);
    const std::string listing = tf::format_tape(g, true);
    CHECK(listing.find("#0    embedding") != std::string::npos);
    CHECK(listing.find("backward visits " + std::to_string(g.ops.size())) != std::string::npos);
    CHECK(listing.find("grad of generator.weight (12, 8)") != std::string::npos);
    // The tensors a module reports through its probes carry the lessons' names, with their record.
    for (const char* probe : {"q #", "k #", "v #", "scores #", "weights #", "context #", "ffn_hidden #", "logits #"})
        CHECK(listing.find(probe) != std::string::npos);
    for (const auto& op : g.ops)
        if (op.op == "softmax") CHECK(g.tensors[std::size_t(op.output)].name.rfind("weights #", 0) == 0);
    CHECK(listing.find("[generator]") != std::string::npos);  // the output projection: the model's own parameter
}

TEST_CASE("tape: the DOT graph is well-formed, coloured, top to bottom, collapsed to one node per layer or module, and says when no gradient was computed", "[tape][autograd]") {
    TinyModel t;
    tf::TapeStepOptions forward_only;
    forward_only.backward = false;
    const tf::TapeGraph before = tf::record_training_step(t.model, t.src, t.tgt, forward_only);
    CHECK(before.backward_order.empty());
    const DotSummary d0 = parse_dot(tf::tape_dot(before, ""));
    CHECK(d0.nodes.size() == before.ops.size() + before.tensors.size());
    CHECK(d0.edges.size() > before.ops.size());
    for (const auto& [id, label] : d0.labels)
        if (id[0] == 't') CHECK(label.find("grad: not computed") != std::string::npos);
    CHECK(d0.cluster_labels.empty());

    const tf::TapeGraph after = tf::record_training_step(t.model, t.src, t.tgt, {});
    const std::string flat_dot = tf::tape_dot(after, "");
    CHECK(flat_dot.find("  rankdir=TB;\n") != std::string::npos);  // top to bottom, to fit a page
    const DotSummary flat = parse_dot(flat_dot);
    int with_grad = 0;
    for (const auto& [id, label] : flat.labels) with_grad += label.find("grad: norm") != std::string::npos;
    CHECK(with_grad > int(after.ops.size()));
    CHECK(flat.fills.at("t0") == "lightblue");  // src_embed.weight, the first input recorded
    std::set<std::string> fills;
    for (const auto& [id, f] : flat.fills) fills.insert(f);
    CHECK(fills == std::set<std::string>{"lightblue", "lightgrey", "orange", "darkolivegreen1", "white"});

    // Collapsed by layer: each layer one node that lists its ops and parameters, no cluster; what lies outside
    // the layers (embeddings, generator, loss) keeps its nodes. Far fewer nodes than the flat graph.
    const DotSummary d1 = parse_dot(tf::tape_dot(after, "layer"));
    CHECK(d1.cluster_labels.empty());
    for (const std::string layer : {"encoder.layers.0", "decoder.layers.0"}) {
        INFO(layer);
        REQUIRE(d1.labels.count("\"g_" + layer + "\""));
        const std::string label = d1.labels.at("\"g_" + layer + "\"");
        CHECK_THAT(label, Catch::StartsWith("{" + layer + " | ") && Catch::Contains("softmax") &&
                              Catch::Contains(" parameters: ") && Catch::Contains("activations saved}"));
        CHECK(d1.fills.at("\"g_" + layer + "\"") == "lightyellow");
    }
    CHECK(d1.nodes.size() * 3 < flat.nodes.size());
    CHECK(d1.labels.count("t0"));  // src_embed.weight lies outside the layers
    const DotSummary d2 = parse_dot(tf::tape_dot(after, "module"));
    CHECK(d2.cluster_labels.empty());
    int modules = 0;
    for (const auto& id : d2.nodes) modules += id.rfind("\"g_", 0) == 0;
    CHECK(modules > 10);
    CHECK(d2.nodes.size() * 2 < flat.nodes.size());
    CHECK_THROWS_WITH(tf::tape_dot(after, "block"), Catch::Contains("layer, module"));

    if (tool_missing("dot", "Graphviz (Debian: graphviz): the DOT output was checked structurally only, not rendered"))
        return;
    TempDir tmp("tape_dot");
    for (const std::string collapse : {"", "layer", "module"}) {
        INFO("--collapse '" << collapse << "'");
        write_all(tmp / "tape.dot", tf::tape_dot(after, collapse));
        CHECK(std::system(("dot -Tsvg " + shell_quote(tmp / "tape.dot") + " -o " + shell_quote(tmp / "tape.svg")).c_str()) == 0);
        const std::string svg = read_all(tmp / "tape.svg");
        REQUIRE(svg.find("<svg width=\"") != std::string::npos);
        // The drawing fits A3 portrait, 842 × 1191 pt (Graphviz writes its size in points).
        const double width = std::stod(svg.substr(svg.find("<svg width=\"") + 12));
        const double height = std::stod(svg.substr(svg.find("height=\"", svg.find("<svg width=")) + 8));
        CHECK(width <= 842.5);
        CHECK(height <= 1191.5);
    }
}

TEST_CASE("tape: two backward passes without zero_grad double every gradient", "[tape][autograd]") {
    TinyModel t;
    const std::string report = tf::backward_twice_report(t.model, t.src, t.tgt, {});
    CHECK(report.find("every gradient doubled") != std::string::npos);
    CHECK(report.find("NOT") == std::string::npos);
    CHECK(report.find("generator.weight") != std::string::npos);
}

TEST_CASE("tape: the command writes DOT and refuses contradictory flags", "[tape][cli]") {
    TempDir tmp("tape_cli");
    const std::string out = tmp / "out.txt", err = tmp / "err.txt", dot = tmp / "g.dot";
    auto run = [&](const std::string& args) {
        return std::system((shell_quote(TF_CLI) + " --threads 1 tape " + args + " >" + shell_quote(out) + " 2>" + shell_quote(err)).c_str());
    };
    REQUIRE(run("--dot " + shell_quote(dot) + " --collapse module --step-backward --backward-twice") == 0);
    const std::string text = read_all(out);
    CHECK(text.find("forward: ") != std::string::npos);
    CHECK(text.find("backward, record by record") != std::string::npos);
    CHECK(text.find("every gradient doubled") != std::string::npos);
    CHECK(read_all(dot).rfind("digraph tape {", 0) == 0);
    REQUIRE(run("--forward-only --src 'x y' --tgt 'y x z'") == 0);
    CHECK(read_all(out).find("backward: not run") != std::string::npos);
    for (const std::string& bad : std::vector<std::string>{"--collapse layer", "--collapse block --dot " + shell_quote(dot), "--forward-only --step-backward",
                                  "--src ''", "--heads 3", "--dot " + shell_quote(tmp.str())}) {
        INFO(bad);
        CHECK(run(bad) != 0);
        const std::vector<std::string> lines = split_lines(read_all(err));
        REQUIRE(lines.size() == 1);
        CHECK(lines[0].rfind("tapeformer:", 0) == 0);
    }
}

TEST_CASE("gradcheck --op: one op element by element, an unknown op lists the valid ones", "[gradcheck][autograd][cli]") {
    TempDir tmp("gradcheck_op");
    const std::string out = tmp / "out.txt", err = tmp / "err.txt";
    REQUIRE(std::system((shell_quote(TF_CLI) + " gradcheck --op softmax >" + shell_quote(out) + " 2>" + shell_quote(err)).c_str()) == 0);
    const std::vector<std::string> lines = split_lines(read_all(out));
    int elements = 0;
    for (const auto& l : lines) {
        if (l.rfind("0      (", 0) != 0) continue;
        ++elements;
        // input, element, analytic, numeric, |a - n|, rel error: analytic and numeric agree closely
        std::istringstream in(l.substr(l.find(')') + 1));
        double a, n, diff, rel;
        in >> a >> n >> diff >> rel;
        CHECK(std::abs(a - n) < 1e-7);
        CHECK(rel < 1e-5);
    }
    CHECK(elements == 2 * 3 * 6);  // the softmax check's input is (2, 3, 6)
    CHECK(lines.back().find("PASS") != std::string::npos);
    CHECK(std::system((shell_quote(TF_CLI) + " gradcheck --op softmx >/dev/null 2>" + shell_quote(err)).c_str()) != 0);
    const std::vector<std::string> e = split_lines(read_all(err));
    REQUIRE(e.size() == 1);
    CHECK(e[0].find("no op 'softmx'") != std::string::npos);
    CHECK(e[0].find("matmul") != std::string::npos);
    CHECK(e[0].find("layer_norm") != std::string::npos);
}
