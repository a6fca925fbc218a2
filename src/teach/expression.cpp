// A first graph (expression.h): a recursive-descent parser, one function per grammar rule, and the walk that
// computes the parsed expression with the ops of ops.h while the tape records.
#include "tapeformer/teach/expression.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/io.h"
#include "tapeformer/number_text.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {

const char* const kFunctions[] = {"tanh", "sigmoid", "exp", "log", "relu"};

bool is_function(const std::string& name) {
    for (const char* f : kFunctions)
        if (name == f) return true;
    return false;
}

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string trim_blanks(const std::string& s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

class Parser {
public:
    explicit Parser(const std::string& text) : s_(text) {}

    Expr parse() {
        skip_blanks();
        if (at_end()) throw std::invalid_argument("the expression is empty");
        Expr e = expression();
        skip_blanks();
        if (!at_end()) fail_unexpected();
        return e;
    }

private:
    // expression := term (('+' | '-') term)*
    Expr expression() {
        const std::size_t start = here();
        Expr e = term();
        while (peek() == '+' || peek() == '-') {
            const char op = take();
            e = binary(op, std::move(e), term(), start);
        }
        return e;
    }

    // term := unary (('*' | '/') unary)*
    Expr term() {
        const std::size_t start = here();
        Expr e = unary();
        while (peek() == '*' || peek() == '/') {
            const char op = take();
            e = binary(op, std::move(e), unary(), start);
        }
        return e;
    }

    // unary := '-' unary | power
    Expr unary() {
        const std::size_t start = here();
        if (peek() != '-') return power();
        take();
        Expr e = node(Expr::Kind::Negate, "-", start);
        e.args.push_back(unary());
        return finish(std::move(e), start);
    }

    // power := primary ('^' unary)?
    Expr power() {
        const std::size_t start = here();
        Expr base = primary();
        if (peek() != '^') return base;
        take();
        const std::size_t exponent_at = here();
        Expr exponent = unary();
        if (!variables_of(exponent).empty())
            throw std::invalid_argument("the exponent at column " + std::to_string(exponent_at + 1) +
                                        " must be a number (x^2, x^-1, x^0.5), not an expression of variables");
        return binary('^', std::move(base), std::move(exponent), start);
    }

    // primary := number | name | function '(' expression ')' | '(' expression ')'
    Expr primary() {
        const std::size_t start = here();
        const char c = peek();
        if (c == '(') {
            take();
            Expr e = expression();
            expect(')');
            return e;  // its text is what is inside the parentheses
        }
        if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return number(start);
        if (!is_name_start(c)) fail_unexpected();
        std::size_t end = start;
        while (end < s_.size() && is_name_char(s_[end])) ++end;
        const std::string name = s_.substr(start, end - start);
        pos_ = end;
        if (peek() != '(') {
            if (is_function(name)) throw std::invalid_argument("'" + name + "' at column " + std::to_string(start + 1) + " is a function: write " + name + "(...)");
            return finish(node(Expr::Kind::Variable, name, start), start);
        }
        if (!is_function(name)) {
            std::string known;
            for (const char* f : kFunctions) known += (known.empty() ? "" : ", ") + std::string(f);
            throw std::invalid_argument("unknown function '" + name + "' at column " + std::to_string(start + 1) + " (known: " + known + ")");
        }
        take();
        Expr e = node(Expr::Kind::Call, name, start);
        e.args.push_back(expression());
        expect(')');
        return finish(std::move(e), start);
    }

    Expr number(std::size_t start) {
        std::size_t end = start;
        while (end < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[end])) || s_[end] == '.')) ++end;
        if (end < s_.size() && (s_[end] == 'e' || s_[end] == 'E')) {  // an exponent: 1e-3
            std::size_t e = end + 1;
            if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
            if (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) {
                while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
                end = e;
            }
        }
        const std::string text = s_.substr(start, end - start);
        double value = 0;
        if (read_real(text, value) != NumberRead::ok)
            throw std::invalid_argument("'" + text + "' at column " + std::to_string(start + 1) + " is not a finite number");
        pos_ = end;
        Expr e = node(Expr::Kind::Number, text, start);
        e.number = value;
        return finish(std::move(e), start);
    }

    Expr node(Expr::Kind kind, const std::string& name, std::size_t start) const {
        Expr e;
        e.kind = kind;
        e.name = name;
        e.column = int(start) + 1;
        return e;
    }
    Expr binary(char op, Expr lhs, Expr rhs, std::size_t start) {
        Expr e = node(Expr::Kind::Binary, std::string(1, op), start);
        e.args.push_back(std::move(lhs));
        e.args.push_back(std::move(rhs));
        return finish(std::move(e), start);
    }
    // The node's text: the source from its start to here.
    Expr finish(Expr e, std::size_t start) const {
        e.text = trim_blanks(s_.substr(start, pos_ - start));
        return e;
    }

    void skip_blanks() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
    }
    bool at_end() const { return pos_ >= s_.size(); }
    std::size_t here() {  // the position of the next token
        skip_blanks();
        return pos_;
    }
    char peek() {
        skip_blanks();
        return at_end() ? '\0' : s_[pos_];
    }
    char take() { return s_[pos_++]; }
    void expect(char c) {
        if (peek() != c) fail_unexpected();
        take();
    }
    [[noreturn]] void fail_unexpected() {
        skip_blanks();
        const std::string column = std::to_string(pos_ + 1);
        if (at_end()) throw std::invalid_argument("unexpected end of the expression at column " + column);
        throw std::invalid_argument("unexpected '" + std::string(1, s_[pos_]) + "' at column " + column);
    }

    const std::string& s_;
    std::size_t pos_ = 0;
};

void collect_variables(const Expr& e, std::vector<std::string>& out) {
    if (e.kind == Expr::Kind::Variable) {
        for (const std::string& v : out)
            if (v == e.name) return;
        out.push_back(e.name);
    }
    for (const Expr& a : e.args) collect_variables(a, out);
}

// The value of an expression without variables (an exponent).
double number_of(const Expr& e) {
    switch (e.kind) {
        case Expr::Kind::Number: return e.number;
        case Expr::Kind::Negate: return -number_of(e.args[0]);
        case Expr::Kind::Variable: break;
        case Expr::Kind::Call: {
            const double x = number_of(e.args[0]);
            if (e.name == "tanh") return std::tanh(x);
            if (e.name == "sigmoid") return 1 / (1 + std::exp(-x));
            if (e.name == "exp") return std::exp(x);
            if (e.name == "log") return std::log(x);
            return x > 0 ? x : 0;  // relu
        }
        case Expr::Kind::Binary: {
            const double a = number_of(e.args[0]), b = number_of(e.args[1]);
            switch (e.name[0]) {
                case '+': return a + b;
                case '-': return a - b;
                case '*': return a * b;
                case '/': return a / b;
                default: return std::pow(a, b);
            }
        }
    }
    throw std::logic_error("number_of: '" + e.text + "' has a variable");
}

// Computes an expression with the ops of ops.h. Every tensor it makes is named by its expression's text: a
// record's output in `recorded` (in the order the tape records them), a value that needs no gradient (a number,
// or an op on numbers only, which records nothing) in `constants`.
struct Evaluator {
    ParamList variables;               // the leaves that require grad, named as written
    ParamList constants;
    std::vector<std::string> recorded;

    Tensor eval(const Expr& e) {
        if (e.kind == Expr::Kind::Variable) {
            for (const NamedTensor& v : variables)
                if (v.name == e.name) return v.tensor;
            throw std::logic_error("no tensor for variable " + e.name);  // record_expression made one for each
        }
        Tensor out = compute(e);
        if (out.requires_grad()) recorded.push_back(e.text);
        else constants.push_back({e.text, out});
        return out;
    }

    Tensor compute(const Expr& e) {
        switch (e.kind) {
            case Expr::Kind::Number: return Tensor::scalar(real(e.number));
            case Expr::Kind::Negate: return scale(eval(e.args[0]), real(-1));
            case Expr::Kind::Call: {
                const Tensor x = eval(e.args[0]);
                if (e.name == "tanh") return tanh(x);
                if (e.name == "sigmoid") return sigmoid(x);
                if (e.name == "exp") return exp(x);
                if (e.name == "log") return log(x);
                return relu(x);
            }
            case Expr::Kind::Binary: {
                if (e.name == "^") return pow(eval(e.args[0]), real(number_of(e.args[1])));
                const Tensor a = eval(e.args[0]), b = eval(e.args[1]);
                switch (e.name[0]) {
                    case '+': return add(a, b);
                    case '-': return sub(a, b);
                    case '*': return mul(a, b);
                    default: return div(a, b);
                }
            }
            case Expr::Kind::Variable: break;
        }
        throw std::logic_error("compute: a variable is no op");
    }
};

std::string names(const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
    return out;
}

}  // namespace

Expr parse_expression(const std::string& text) { return Parser(text).parse(); }

std::vector<std::string> variables_of(const Expr& e) {
    std::vector<std::string> out;
    collect_variables(e, out);
    return out;
}

Assignments parse_assignments(const std::string& text) {
    Assignments out;
    std::size_t from = 0;
    while (from <= text.size()) {
        const std::size_t comma = std::min(text.find(',', from), text.size());
        const std::string part = trim_blanks(text.substr(from, comma - from));
        from = comma + 1;
        const std::size_t eq = part.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("'" + part + "' is not name=value (a=2,b=-3)");
        const std::string name = trim_blanks(part.substr(0, eq)), value_text = trim_blanks(part.substr(eq + 1));
        bool identifier = !name.empty() && is_name_start(name[0]);
        for (char c : name) identifier = identifier && is_name_char(c);
        if (!identifier) throw std::invalid_argument("'" + name + "' is not a variable name (a letter or _, then letters, digits or _)");
        if (is_function(name)) throw std::invalid_argument("'" + name + "' is a function, not a variable");
        double value = 0;
        if (read_real(value_text, value) != NumberRead::ok)
            throw std::invalid_argument(name + "=" + value_text + ": '" + value_text + "' is not a finite number");
        for (const auto& [n, v] : out)
            if (n == name) throw std::invalid_argument(name + " is given twice");
        out.emplace_back(name, value);
    }
    return out;
}

void check_assignments(const Expr& e, const Assignments& values) {
    const std::vector<std::string> used = variables_of(e);
    for (const std::string& name : used)
        if (std::none_of(values.begin(), values.end(), [&](const auto& nv) { return nv.first == name; }))
            throw std::invalid_argument("no value for " + name + " (the expression uses " + names(used) + "; give each as name=value)");
    for (const auto& [n, v] : values)
        if (std::find(used.begin(), used.end(), n) == used.end())
            throw std::invalid_argument(n + " is not in the expression (it uses " + names(used) + ")");
}

TapeGraph record_expression(const Expr& e, const Assignments& values, bool run_backward) {
    const std::vector<std::string> used = variables_of(e);
    if (used.empty()) throw std::invalid_argument("'" + e.text + "' has no variable: there is nothing to differentiate");
    if (e.kind == Expr::Kind::Variable)
        throw std::invalid_argument("'" + e.text + "' is a variable alone: no op to record (try tanh(" + e.text + "))");
    check_assignments(e, values);
    Evaluator ev;
    for (const std::string& name : used)
        for (const auto& [n, v] : values)
            if (n == name) ev.variables.push_back({name, Tensor::scalar(real(v)).set_requires_grad(true)});

    tape().clear();
    tape().set_recording(true);
    Tensor result = ev.eval(e);  // (): one number
    TapeGraph g = graph_of_tape(result, ev.variables, ev.constants, run_backward);
    // Each record's output is named by the text of the expression it computed.
    if (ev.recorded.size() != g.ops.size()) throw std::logic_error("record_expression: records and expressions disagree");
    for (std::size_t r = 0; r < g.ops.size(); ++r) g.tensors[g.ops[r].output].name = ev.recorded[r];
    g.output_label = e.text;
    g.output_note.clear();
    std::string at;
    for (const auto& [n, v] : values) at += (at.empty() ? "" : ", ") + n + " = " + fmt("%g", v);
    g.title = e.text + " at " + at;
    return g;
}

TF_NAMESPACE_END
