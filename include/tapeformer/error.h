// How the library reports bad input: an exception a user can read, whose message starts with what found
// the problem ("matmul: ...", "schedule: ...", "model.safetensors: ..."), followed by what was expected.
#pragma once
#include <stdexcept>
#include <string>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// Throws Error("<who>: <what>"). std::invalid_argument for a bad call (a shape, an option); files that
// cannot be read as expected throw std::runtime_error instead (fail<std::runtime_error>(path, ...)).
template <class Error = std::invalid_argument>
[[noreturn]] void fail(const std::string& who, const std::string& what) {
    throw Error(who + ": " + what);
}

TF_NAMESPACE_END
