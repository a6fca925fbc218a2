// How the library reports bad input: an exception a user can read, whose message starts with what found
// the problem ("matmul: ...", "schedule: ...", "model.safetensors: ..."), followed by what was expected.
#pragma once
#include <stdexcept>
#include <string>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// `message` as one printable line: line breaks, tabs and other control bytes become \n, \r, \t, \xNN.
// Messages quote names and values from the files they refuse (a tensor named "a\nb"), and the CLI
// promises one line per error: it prints every message through this.
inline std::string one_line(const std::string& message) {
    std::string out;
    for (const char ch : message) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7F) {
            const char* hex = "0123456789ABCDEF";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else out += ch;
    }
    return out;
}

// Throws Error("<who>: <what>"). std::invalid_argument for a bad call (a shape, an option); files that
// cannot be read as expected throw std::runtime_error instead (fail<std::runtime_error>(path, ...)).
template <class Error = std::invalid_argument>
[[noreturn]] void fail(const std::string& who, const std::string& what) {
    throw Error(who + ": " + what);
}

TF_NAMESPACE_END
