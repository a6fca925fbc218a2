// Numbers typed by a person (flags, settings, run files) read strictly: the whole text is the number, with
// no blank before, inside or after it, and a value past its type is reported, never saturated or wrapped.
// The caller checks the number's own range and words the error, naming its flag or setting; these only say
// which of the two ways the text failed ("got 'abc'" for a malformed number, "got 1e999" for one too large).
#pragma once
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

enum class NumberRead { ok, not_a_number, out_of_range };

namespace number_detail {

// strtoll and friends skip leading blanks; the whole text must be the number, so none is allowed anywhere.
inline bool is_whole(const std::string& text, const char* end) {
    if (text.empty() || end != text.c_str() + text.size()) return false;
    for (char ch : text)
        if (std::isspace(static_cast<unsigned char>(ch))) return false;
    return true;
}

}  // namespace number_detail

// A decimal integer, sign allowed ("-12", "+3"); out_of_range past long long.
inline NumberRead read_integer(const std::string& text, long long& value) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (!number_detail::is_whole(text, end)) return NumberRead::not_a_number;
    if (errno == ERANGE) return NumberRead::out_of_range;
    value = v;
    return NumberRead::ok;
}

// A decimal integer >= 0 ("-1" is not one: strtoull alone would wrap it); out_of_range past unsigned long long.
inline NumberRead read_unsigned(const std::string& text, unsigned long long& value) {
    if (!text.empty() && text[0] == '-') return NumberRead::not_a_number;
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (!number_detail::is_whole(text, end)) return NumberRead::not_a_number;
    if (errno == ERANGE) return NumberRead::out_of_range;
    value = v;
    return NumberRead::ok;
}

// A real number as strtod reads it ("0.1", "-3", "1e-3"); out_of_range when it is not finite ("inf", "nan",
// "1e999"). A value too small for a double reads as 0 or a subnormal, as strtod gives it.
inline NumberRead read_real(const std::string& text, double& value) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (!number_detail::is_whole(text, end)) return NumberRead::not_a_number;
    if (!std::isfinite(v)) return NumberRead::out_of_range;
    value = v;
    return NumberRead::ok;
}

TF_NAMESPACE_END
