// A first graph, micrograd's size: `tapeformer tape --expr "tanh(a*b + c)" --set a=2,b=-3,c=10`. The expression
// is parsed, then computed through the same ops (ops.h) and the same tape (autograd.h) as a Transformer, each
// number a one-element tensor, and differentiated by the same backward; tape_view.h prints and draws it.
//
// The grammar, one parsing function per line (recursive descent; `^` binds tighter than unary minus, as in
// mathematics: -a^2 = -(a^2), and is right-associative: a^b^c = a^(b^c)):
//   expression := term (('+' | '-') term)*
//   term       := unary (('*' | '/') unary)*
//   unary      := '-' unary | power
//   power      := primary ('^' unary)?           the exponent must be a number: x^2, x^-1, x^0.5
//   primary    := number | name | function '(' expression ')' | '(' expression ')'
//   function   := tanh | sigmoid | exp | log | relu
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/teach/tape_view.h"

TF_NAMESPACE_BEGIN

// One node of the parsed expression.
struct Expr {
    enum class Kind { Number, Variable, Negate, Binary, Call };
    Kind kind = Kind::Number;
    std::string text;        // the source it was read from, without outer blanks or parentheses: its name in the graph
    std::string name;        // the operator ("+", "^"), the function ("tanh") or the variable ("a")
    double number = 0;       // of a Number
    std::vector<Expr> args;  // the operands: one (Negate, Call) or two (Binary)
    int column = 0;          // 1-based, where it starts
};

// Parses `text`. Bad input throws std::invalid_argument naming what and where: "unexpected ')' at column 7".
Expr parse_expression(const std::string& text);

// The variables of `e`, in the order they first appear.
std::vector<std::string> variables_of(const Expr& e);

using Assignments = std::vector<std::pair<std::string, double>>;  // name, value, in the order given

// "a=2,b=-3,c=10" -> {{"a", 2}, {"b", -3}, {"c", 10}}. Throws std::invalid_argument for a part without '=', a
// name that is no identifier, a value that is no finite number, or a name given twice.
Assignments parse_assignments(const std::string& text);

// Every variable of `e` has a value and every value a variable of `e` (a typo is not silently ignored); else
// std::invalid_argument naming the variable.
void check_assignments(const Expr& e, const Assignments& values);

// Computes `e` on the tape with `values` for its variables, then (run_backward) backward from its value: the graph
// of tape_view.h, every tensor named by its text ("a", "a*b", "tanh(a*b + c)"). Throws std::invalid_argument when
// e has no op on a variable, or as check_assignments does. A variable used twice is one tensor, and backward
// adds both uses' gradients into it.
TapeGraph record_expression(const Expr& e, const Assignments& values, bool run_backward);

TF_NAMESPACE_END
