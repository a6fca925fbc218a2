// A first graph (teach/expression.h, `tapeformer tape --expr`): the parser's precedence and its errors, the values
// and gradients of micrograd's tanh(a*b + c) against the hand-derived ones, and every variable's gradient of a few
// expressions against central differences of a reference evaluator in double, independent of the tape.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tapeformer/teach/expression.h"
#include "helpers.h"

using namespace tf_test;

namespace {

// The tensor of the graph named `name`.
const tf::TapeTensor& named(const tf::TapeGraph& g, const std::string& name) {
    for (const tf::TapeTensor& t : g.tensors)
        if (t.name == name) return t;
    FAIL("no tensor named " << name);
    throw 0;
}

// The parse error of `text` ("" when it parses).
std::string parse_error(const std::string& text) {
    try {
        tf::parse_expression(text);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

// The expression's value in double, straight from the parse tree: the reference the tape is compared with.
double reference(const tf::Expr& e, const std::map<std::string, double>& at) {
    using K = tf::Expr::Kind;
    switch (e.kind) {
        case K::Number: return e.number;
        case K::Variable: return at.at(e.name);
        case K::Negate: return -reference(e.args[0], at);
        case K::Call: {
            const double x = reference(e.args[0], at);
            if (e.name == "tanh") return std::tanh(x);
            if (e.name == "sigmoid") return 1 / (1 + std::exp(-x));
            if (e.name == "exp") return std::exp(x);
            if (e.name == "log") return std::log(x);
            return x > 0 ? x : 0;
        }
        case K::Binary: {
            const double a = reference(e.args[0], at), b = reference(e.args[1], at);
            if (e.name == "+") return a + b;
            if (e.name == "-") return a - b;
            if (e.name == "*") return a * b;
            if (e.name == "/") return a / b;
            return std::pow(a, b);
        }
    }
    return 0;
}

double value_of(const std::string& text, const tf::Assignments& at) {
    return tf::record_expression(tf::parse_expression(text), at, false).loss;
}

}  // namespace

TEST_CASE("expression: micrograd's tanh(a*b + c) has the hand-derived value and gradients", "[expression][autograd]") {
    const tf::TapeGraph g = tf::record_expression(tf::parse_expression("tanh(a*b + c)"), {{"a", 2}, {"b", -3}, {"c", 10}}, true);
    // Three records, as written: a*b, then + c, then tanh; backward visits them in reverse.
    REQUIRE(g.ops.size() == 3);
    CHECK(g.ops[0].op == "mul");
    CHECK(g.ops[1].op == "add");
    CHECK(g.ops[2].op == "tanh");
    CHECK(g.backward_order == std::vector<int>{2, 1, 0});
    // y = tanh(n), n = a·b + c = 4.  dy/dn = 1 − tanh²(4);  dy/da = b·dy/dn, dy/db = a·dy/dn, dy/dc = dy/dn.
    const double t = std::tanh(4.0), dn = 1 - t * t;
    CHECK(g.loss == Approx(t).epsilon(1e-6));
    CHECK(named(g, "a*b").first_values[0] == Approx(-6));
    CHECK(named(g, "a*b + c").first_values[0] == Approx(4));
    CHECK(named(g, "tanh(a*b + c)").first_grads[0] == Approx(1));
    CHECK(named(g, "a*b + c").first_grads[0] == Approx(dn).epsilon(1e-5));
    CHECK(named(g, "a*b").first_grads[0] == Approx(dn).epsilon(1e-5));
    CHECK(named(g, "a").first_grads[0] == Approx(-3 * dn).epsilon(1e-5));
    CHECK(named(g, "b").first_grads[0] == Approx(2 * dn).epsilon(1e-5));
    CHECK(named(g, "c").first_grads[0] == Approx(dn).epsilon(1e-5));
    CHECK(named(g, "a").kind == tf::TapeTensor::Kind::Parameter);
    CHECK(named(g, "tanh(a*b + c)").kind == tf::TapeTensor::Kind::Loss);
}

TEST_CASE("expression: a variable used twice gets the sum of both uses' gradients", "[expression][autograd]") {
    // d(a·a)/da = 2a: the mul's backward adds b·g into a's gradient, then a·g into the same gradient.
    const tf::TapeGraph g = tf::record_expression(tf::parse_expression("a*a"), {{"a", 3}}, true);
    CHECK(g.loss == Approx(9));
    CHECK(named(g, "a").first_grads[0] == Approx(6));
    REQUIRE(g.ops[0].inputs.size() == 2);
    CHECK(g.ops[0].inputs[0] == g.ops[0].inputs[1]);  // one tensor, drawn once with two edges
}

TEST_CASE("expression: every gradient matches central differences of a reference in double", "[expression][autograd]") {
    struct Case {
        std::string text;
        tf::Assignments at;
    };
    const std::vector<Case> cases = {
        {"tanh(a*b + c)", {{"a", 2}, {"b", -3}, {"c", 10}}},
        {"tanh(a*b + c)", {{"a", 0.3}, {"b", -0.7}, {"c", 0.2}}},
        {"a*a + a/b - exp(-c)", {{"a", 1.5}, {"b", -2}, {"c", 0.5}}},
        {"sigmoid(x)^2 * log(y) + relu(z - x)", {{"x", 0.4}, {"y", 2.5}, {"z", 1.1}}},
        {"-(a - b)^3 / (1 + c^2)", {{"a", 0.8}, {"b", -0.4}, {"c", 1.3}}},
        {"w^-1 + 2*w*v - v^0.5", {{"w", 1.7}, {"v", 0.9}}},
    };
    for (const Case& c : cases) {
        INFO(c.text);
        const tf::Expr e = tf::parse_expression(c.text);
        const tf::TapeGraph g = tf::record_expression(e, c.at, true);
        std::map<std::string, double> at(c.at.begin(), c.at.end());
        CHECK(g.loss == Approx(reference(e, at)).epsilon(1e-5));
        for (const auto& [name, value] : c.at) {
            INFO("d/d" << name);
            const double h = 1e-6;
            std::map<std::string, double> up = at, down = at;
            up[name] = value + h;
            down[name] = value - h;
            const double numeric = (reference(e, up) - reference(e, down)) / (2 * h);
            CHECK(named(g, name).first_grads[0] == Approx(numeric).epsilon(1e-4).margin(1e-6));
        }
    }
}

TEST_CASE("expression: precedence and associativity as in mathematics", "[expression]") {
    CHECK(value_of("-a^2", {{"a", 3}}) == Approx(-9));         // ^ before unary minus
    CHECK(value_of("a - b - c", {{"a", 2}, {"b", -3}, {"c", 10}}) == Approx(-5));  // left to right
    CHECK(value_of("a / b / c", {{"a", 8}, {"b", 2}, {"c", 2}}) == Approx(2));
    CHECK(value_of("x * 2^3^2", {{"x", 1}}) == Approx(512));   // 2^(3^2)
    CHECK(value_of("a + b * c", {{"a", 1}, {"b", 2}, {"c", 3}}) == Approx(7));
    CHECK(value_of("(a + b) * c", {{"a", 1}, {"b", 2}, {"c", 3}}) == Approx(9));
    CHECK(value_of("a * -1.5e1", {{"a", 2}}) == Approx(-30));
    // Each node is named by its source text; parentheses are not part of a name.
    const tf::Expr e = tf::parse_expression(" tanh( a*b  + c ) ");
    CHECK(e.text == "tanh( a*b  + c )");
    CHECK(e.args[0].text == "a*b  + c");
    CHECK(e.args[0].args[0].text == "a*b");
    CHECK(tf::variables_of(tf::parse_expression("b*a + a")) == std::vector<std::string>{"b", "a"});
    // Numbers only (2*3) need no gradient: a constant of the graph, not a record.
    const tf::TapeGraph g = tf::record_expression(tf::parse_expression("a + 2*3"), {{"a", 1}}, true);
    CHECK(g.ops.size() == 1);
    CHECK(named(g, "2*3").kind == tf::TapeTensor::Kind::Constant);
}

TEST_CASE("expression: bad input names what and where", "[expression]") {
    CHECK(parse_error("tanh(a))") == "unexpected ')' at column 8");
    CHECK(parse_error("a + * b") == "unexpected '*' at column 5");
    CHECK(parse_error("tanh(a") == "unexpected end of the expression at column 7");
    CHECK(parse_error("a $ b") == "unexpected '$' at column 3");
    CHECK(parse_error("2a") == "unexpected 'a' at column 2");
    CHECK(parse_error("()") == "unexpected ')' at column 2");
    CHECK(parse_error("   ") == "the expression is empty");
    CHECK(parse_error("foo(a)").find("unknown function 'foo' at column 1 (known: tanh") == 0);
    CHECK(parse_error("tanh + a") == "'tanh' at column 1 is a function: write tanh(...)");
    CHECK(parse_error("a^b").find("the exponent at column 3 must be a number") == 0);
    CHECK(parse_error("1.2.3 * a") == "'1.2.3' at column 1 is not a finite number");
    CHECK(parse_error("tanh(a*b + c)").empty());

    const tf::Expr e = tf::parse_expression("a*b");
    CHECK_THROWS_WITH(tf::check_assignments(e, {{"a", 1}}), Catch::StartsWith("no value for b (the expression uses a, b"));
    CHECK_THROWS_WITH(tf::check_assignments(e, {{"a", 1}, {"b", 2}, {"d", 3}}), Catch::StartsWith("d is not in the expression"));
    CHECK_THROWS_WITH(tf::record_expression(tf::parse_expression("2*3"), {}, true), Catch::Contains("has no variable"));
    CHECK_THROWS_WITH(tf::record_expression(tf::parse_expression("a"), {{"a", 1}}, true), Catch::Contains("a variable alone"));

    CHECK(tf::parse_assignments("a=2, b=-3,c=1e1") == tf::Assignments{{"a", 2}, {"b", -3}, {"c", 10}});
    CHECK_THROWS_WITH(tf::parse_assignments("a=2,b"), "'b' is not name=value (a=2,b=-3)");
    CHECK_THROWS_WITH(tf::parse_assignments("a=x"), "a=x: 'x' is not a finite number");
    CHECK_THROWS_WITH(tf::parse_assignments("a=1,a=2"), "a is given twice");
    CHECK_THROWS_WITH(tf::parse_assignments("2a=1"), Catch::StartsWith("'2a' is not a variable name"));
}

TEST_CASE("expression: the listing and the DOT write each value and gradient, top to bottom", "[expression][tape]") {
    const tf::TapeGraph g = tf::record_expression(tf::parse_expression("tanh(a*b + c)"), {{"a", 2}, {"b", -3}, {"c", 10}}, true);
    REQUIRE(tf::every_tensor_one_number(g));
    const std::string listing = tf::format_tape(g, true);
    CHECK(listing.find("#0    mul   a = 2, b = -3") != std::string::npos);
    CHECK(listing.find("->  tanh(a*b + c) = 0.999329   grad 1") != std::string::npos);
    CHECK(listing.find("tanh(a*b + c) = 0.999329\n") != std::string::npos);
    CHECK(listing.find("gradient of tanh(a*b + c) with respect to each variable:\n  d/da = -0.00402") != std::string::npos);
    CHECK(listing.find("#2 tanh: grad of a*b + c = 0.00134") != std::string::npos);
    const std::string dot = tf::tape_dot(g, "");
    CHECK(dot.find("rankdir=TB;") != std::string::npos);
    CHECK(dot.find("label=\"{a | data 2 | grad -0.004023}\"") != std::string::npos);
    CHECK(dot.find("label=\"tanh(a*b + c) at a = 2, b = -3, c = 10\\nblue: variables") != std::string::npos);
    CHECK(dot.find("(1)") == std::string::npos);  // no shapes: every value is one number
}

TEST_CASE("expression: tape --expr prints the graph, writes DOT, and reports bad input in one line", "[expression][tape][cli]") {
    TempDir tmp("tape_expr");
    const std::string out = tmp / "out.txt", err = tmp / "err.txt", dot = tmp / "g.dot";
    auto run = [&](const std::string& args) {
        return std::system((shell_quote(TF_CLI) + " --threads 1 tape " + args + " >" + shell_quote(out) + " 2>" + shell_quote(err)).c_str());
    };
    REQUIRE(run("--expr 'tanh(a*b + c)' --set a=2,b=-3,c=10 --step-backward --dot " + shell_quote(dot)) == 0);
    const std::string text = read_all(out);
    CHECK(text.find("tanh(a*b + c) = 0.999329") != std::string::npos);
    CHECK(text.find("backward, record by record") != std::string::npos);
    CHECK(read_all(dot).rfind("digraph tape {", 0) == 0);
    // Laid out by Graphviz, micrograd's graph fits a 4:3 slide (10 × 7.5 inches) at its natural size.
    if (!tool_missing("dot", "the DOT's size on a slide is not checked")) {
        const std::string plain = tmp / "g.plain";
        REQUIRE(std::system(("dot -Tplain " + shell_quote(dot) + " -o " + shell_quote(plain)).c_str()) == 0);
        double scale = 0, width = 0, height = 0;
        REQUIRE(std::sscanf(read_all(plain).c_str(), "graph %lf %lf %lf", &scale, &width, &height) == 3);
        CHECK(width <= 10);
        CHECK(height <= 7.5);
    }
    REQUIRE(run("--expr 'a*a' --set a=3 --forward-only") == 0);
    CHECK(read_all(out).find("backward: not run") != std::string::npos);
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--expr 'tanh(a*b + c))' --set a=2,b=-3,c=10", "tapeformer: error: tape --expr: unexpected ')' at column 14"},
        {"--expr 'a*b' --set a=2", "tapeformer: error: tape --set: no value for b"},
        {"--expr 'a*b' --set a=2,b=1,z=1", "tapeformer: error: tape --set: z is not in the expression"},
        {"--set a=2", "tapeformer: error: --set: needs --expr"},
        {"--expr 'a*b' --set a=2,b=1 --src 'x y'", "tapeformer: error: --src: is for a model's tape"},
    };
    for (const auto& [args, message] : bad) {
        INFO(args);
        CHECK(run(args) != 0);
        const std::vector<std::string> lines = split_lines(read_all(err));
        REQUIRE(lines.size() == 1);
        CHECK(lines[0].rfind(message, 0) == 0);
    }
}
