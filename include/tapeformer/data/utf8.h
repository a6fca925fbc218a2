// UTF-8, decoded by the table of well-formed byte sequences (the Unicode standard, §3.9, Table 3-7): the one decoder that
// both the text reader (which rejects invalid lines) and BLEU (which reads every byte, as Python does)
// use, so the two can never disagree on what a character is.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// The character that starts at byte `i` of `s`: its code point and its length in bytes (1 to 4), or
// length 0 when the bytes there are not a well-formed sequence (a stray continuation byte, an overlong
// form, a UTF-16 surrogate, a code point above U+10FFFF, or a sequence cut short by the end of `s`).
struct Utf8Char {
    char32_t code_point = 0;
    int length = 0;
};
Utf8Char decode_utf8_at(std::string_view s, std::size_t i);

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence, or
// std::string_view::npos if `s` is valid.
std::size_t find_invalid_utf8(std::string_view s);

// All code points of `s`; each byte that does not start a well-formed sequence becomes U+FFFD.
std::u32string decode_utf8(std::string_view s);

// Appends the UTF-8 encoding of the code point `cp` (at most U+10FFFF) to `out`.
void append_utf8(std::string& out, char32_t cp);

TF_NAMESPACE_END
