// Integers read from JSON that tapeformer did not necessarily write (a checkpoint's training state,
// run.json, state.json, metrics.jsonl). nlohmann's get<std::int64_t>() on a JSON number such as 1e300 or
// 2.5 converts the double: undefined behaviour out of range (the fuzzer found it), silent truncation in
// range. json_integer accepts only a JSON integer that fits the type.
#pragma once
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// `v` as an Int; std::runtime_error "WHAT is V, not an integer in [MIN, MAX]" otherwise.
template <class Int>
Int json_integer(const nlohmann::json& v, const std::string& what) {
    static_assert(std::is_integral_v<Int> && sizeof(Int) <= 8);
    constexpr Int lo = std::numeric_limits<Int>::min(), hi = std::numeric_limits<Int>::max();
    if (v.is_number_unsigned()) {
        const std::uint64_t u = v.get<std::uint64_t>();
        if (u <= static_cast<std::uint64_t>(hi)) return static_cast<Int>(u);
    } else if (v.is_number_integer()) {
        const std::int64_t i = v.get<std::int64_t>();
        const bool fits = std::is_signed_v<Int> ? (i >= static_cast<std::int64_t>(lo) && i <= static_cast<std::int64_t>(hi))
                                                : i >= 0;  // a non-negative int64 fits every unsigned type of 8 bytes
        if (fits && (std::is_signed_v<Int> || static_cast<std::uint64_t>(i) <= static_cast<std::uint64_t>(hi)))
            return static_cast<Int>(i);
    }
    std::string shown = v.dump();
    if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
    throw std::runtime_error(what + " is " + shown + ", not an integer in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]");
}

// The member `key` of object `j` as an Int, or `fallback` when it is absent.
template <class Int>
Int json_integer_or(const nlohmann::json& j, const char* key, Int fallback) {
    return j.contains(key) ? json_integer<Int>(j.at(key), key) : fallback;
}

TF_NAMESPACE_END
