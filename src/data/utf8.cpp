// UTF-8 decoding and encoding. See utf8.h.
#include "tapeformer/data/utf8.h"

TF_NAMESPACE_BEGIN

Utf8Char decode_utf8_at(std::string_view s, std::size_t i) {
    auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    auto in = [](unsigned char b, unsigned char lo, unsigned char hi) { return b >= lo && b <= hi; };
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) return {b0, 1};
    // Number of continuation bytes, the payload bits of the first byte, and the allowed range of the
    // second byte (which rules out overlong forms, surrogates D800..DFFF and code points above 10FFFF);
    // the other continuation bytes are 80..BF.
    int extra = 0;
    char32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (in(b0, 0xC2, 0xDF)) { extra = 1; cp = b0 & 0x1F; }
    else if (b0 == 0xE0) { extra = 2; cp = b0 & 0x0F; lo = 0xA0; }
    else if (in(b0, 0xE1, 0xEC) || in(b0, 0xEE, 0xEF)) { extra = 2; cp = b0 & 0x0F; }
    else if (b0 == 0xED) { extra = 2; cp = b0 & 0x0F; hi = 0x9F; }
    else if (b0 == 0xF0) { extra = 3; cp = b0 & 0x07; lo = 0x90; }
    else if (in(b0, 0xF1, 0xF3)) { extra = 3; cp = b0 & 0x07; }
    else if (b0 == 0xF4) { extra = 3; cp = b0 & 0x07; hi = 0x8F; }
    else return {};  // 80..C1 or F5..FF can never start a character
    if (i + extra >= s.size()) return {};  // cut short by the end of the text
    if (!in(byte(i + 1), lo, hi)) return {};
    for (int k = 1; k <= extra; ++k) {
        if (k > 1 && !in(byte(i + k), 0x80, 0xBF)) return {};
        cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    return {cp, extra + 1};
}

std::size_t find_invalid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        const int length = decode_utf8_at(s, i).length;
        if (length == 0) return i;
        i += std::size_t(length);
    }
    return std::string_view::npos;
}

std::u32string decode_utf8(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        const Utf8Char c = decode_utf8_at(s, i);
        out.push_back(c.length ? c.code_point : char32_t(0xFFFD));
        i += c.length ? std::size_t(c.length) : 1;
    }
    return out;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

TF_NAMESPACE_END
