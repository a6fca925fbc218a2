// Reading and writing safetensors files (format in safetensors.h). The reader treats the file as hostile:
// every number in the header is checked against the file before it is used to index the data buffer.
#include "tapeformer/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tapeformer/error.h"
#include "tapeformer/io.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp copies values as they lie in memory: safetensors data is little-endian"
#endif

TF_NAMESPACE_BEGIN

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before parsing one.
constexpr std::uint64_t kMaxHeaderSize = 100'000'000;
// Our headers nest three deep (file object, tensor entry, shape list); anything far deeper is not one.
constexpr int kMaxJsonDepth = 16;

// Bytes per element of each dtype the format defines (safetensors' Dtype enum).
int dtype_size(const std::string& dtype) {
    static const std::map<std::string, int> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
}

bool is_floating(const std::string& dtype) {
    return dtype == "F64" || dtype == "F32" || dtype == "F16" || dtype == "BF16";
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + ")";
}

std::string range_str(std::uint64_t begin, std::uint64_t end) {
    return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// A JSON value for an error message, cut short: a hostile header may hold a megabyte-long "shape".
std::string brief(const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Where the 8 hex digits of the checksum stand in the header text, as serialize_safetensors writes it
// ("tapeformer.checksum":"crc32c:XXXXXXXX"); npos unless that token occurs exactly once. Inside a JSON
// string every '"' is escaped, so the token cannot hide in a name or a value.
std::size_t checksum_digits_at(std::string_view header_text) {
    const std::string token = std::string("\"") + kSafetensorsChecksumKey + "\":\"crc32c:";
    const std::size_t at = header_text.find(token);
    if (at == std::string_view::npos || header_text.find(token, at + 1) != std::string_view::npos) return std::string::npos;
    return at + token.size();
}

// IEEE half precision: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
float half_to_float(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1Fu;
    const std::uint32_t mant = h & 0x3FFu;
    std::uint32_t bits;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
        float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
        return sign ? -v : v;
    } else if (exp == 31) {  // infinity or NaN
        bits = sign | 0x7F800000u | (mant << 13);
    } else {  // normal: rebias the exponent from 15 to 127
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// bfloat16 is the top half of a float32.
float bf16_to_float(std::uint16_t h) {
    std::uint32_t bits = std::uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

template <typename T>
void convert(const char* p, std::int64_t n, real* out) {
    for (std::int64_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, p + i * sizeof(T), sizeof(T));  // memcpy: the data need not be aligned for T
        out[i] = static_cast<real>(v);
    }
}

// Decodes `n` values of `dtype` at `p` into real. Returns false for a dtype we cannot convert (F8).
bool decode(const std::string& dtype, const char* p, std::int64_t n, real* out) {
    if (dtype == "F32") convert<float>(p, n, out);
    else if (dtype == "F64") convert<double>(p, n, out);
    else if (dtype == "I64") convert<std::int64_t>(p, n, out);
    else if (dtype == "I32") convert<std::int32_t>(p, n, out);
    else if (dtype == "I16") convert<std::int16_t>(p, n, out);
    else if (dtype == "I8") convert<std::int8_t>(p, n, out);
    else if (dtype == "U64") convert<std::uint64_t>(p, n, out);
    else if (dtype == "U32") convert<std::uint32_t>(p, n, out);
    else if (dtype == "U16") convert<std::uint16_t>(p, n, out);
    else if (dtype == "U8") convert<std::uint8_t>(p, n, out);
    else if (dtype == "BOOL") {
        for (std::int64_t i = 0; i < n; ++i) out[i] = p[i] != 0 ? real(1) : real(0);
    } else if (dtype == "F16" || dtype == "BF16") {
        for (std::int64_t i = 0; i < n; ++i) {
            std::uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            out[i] = static_cast<real>(dtype == "F16" ? half_to_float(h) : bf16_to_float(h));
        }
    } else {
        return false;
    }
    return true;
}

// A tensor entry of the header, checked on its own (dtype known, shape and byte range consistent and
// inside the buffer); load checks the entries against each other afterwards.
struct RawEntry {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;
};

// A non-negative integer that fits int64, or false.
bool as_extent(const json& v, std::uint64_t& out) {
    if (!v.is_number_unsigned()) return false;
    out = v.get<std::uint64_t>();
    return out <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
}

RawEntry check_entry(const std::string& file, const std::string& name, const json& v, std::uint64_t buffer_size) {
    const std::string t = "tensor '" + name + "'";
    if (!v.is_object()) fail<std::runtime_error>(file, t + " is described by " + brief(v) + ", not by an object");
    RawEntry e;
    e.name = name;

    auto dtype = v.find("dtype");
    if (dtype == v.end()) fail<std::runtime_error>(file, t + " has no dtype");
    if (!dtype->is_string()) fail<std::runtime_error>(file, t + " has dtype " + brief(*dtype) + ", not a string");
    e.dtype = dtype->get<std::string>();
    const int size = dtype_size(e.dtype);
    if (size == 0) fail<std::runtime_error>(file, t + " has unknown dtype '" + e.dtype + "'");

    auto shape = v.find("shape");
    if (shape == v.end()) fail<std::runtime_error>(file, t + " has no shape");
    if (!shape->is_array()) fail<std::runtime_error>(file, t + " has shape " + brief(*shape) + ", not a list of extents");
    // numel and byte count with overflow checks: a hostile shape must not wrap around to a small size.
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : *shape) {
        std::uint64_t x;
        if (!as_extent(d, x)) fail<std::runtime_error>(file, t + " has shape " + brief(*shape) + ", not a list of non-negative integers");
        e.shape.push_back(static_cast<std::int64_t>(x));
        if (x != 0 && numel > std::numeric_limits<std::uint64_t>::max() / x) overflow = true;
        numel *= x;
    }
    if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / size)
        fail<std::runtime_error>(file, t + " has shape " + shape_str(e.shape) + ", too large for any file");
    const std::uint64_t nbytes = numel * static_cast<std::uint64_t>(size);

    auto offsets = v.find("data_offsets");
    if (offsets == v.end()) fail<std::runtime_error>(file, t + " has no data_offsets");
    if (!offsets->is_array() || offsets->size() != 2 || !as_extent((*offsets)[0], e.begin) ||
        !as_extent((*offsets)[1], e.end))
        fail<std::runtime_error>(file, t + " has data_offsets " + brief(*offsets) + ", not [begin, end] in bytes");
    if (e.end < e.begin) fail<std::runtime_error>(file, t + " has data_offsets " + range_str(e.begin, e.end) + " that end before they begin");
    if (e.end > buffer_size)
        fail<std::runtime_error>(file, t + " has data_offsets " + range_str(e.begin, e.end) + " outside the data buffer of " +
                       std::to_string(buffer_size) + " bytes");
    if (e.end - e.begin != nbytes)
        fail<std::runtime_error>(file, t + " has " + std::to_string(e.end - e.begin) + " bytes of data but shape " + shape_str(e.shape) +
                       " of " + e.dtype + " needs " + std::to_string(nbytes));
    return e;
}

// Parses the header JSON. Besides JSON syntax (and UTF-8, which nlohmann checks) it refuses what the
// JSON grammar allows but a header must not have: a key twice in one object, absurd nesting.
json parse_header(const std::string& file, std::string_view text) {
    std::vector<std::set<std::string>> keys_of_open_objects;
    std::string problem;
    auto on_event = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
        switch (event) {
        case json::parse_event_t::object_start:
        case json::parse_event_t::array_start:
            if (depth >= kMaxJsonDepth) {
                problem = "header JSON is nested more than " + std::to_string(kMaxJsonDepth) + " deep";
                throw std::runtime_error(problem);
            }
            if (event == json::parse_event_t::object_start) keys_of_open_objects.emplace_back();
            break;
        case json::parse_event_t::object_end: keys_of_open_objects.pop_back(); break;
        case json::parse_event_t::key: {
            const std::string& k = parsed.get_ref<const std::string&>();
            if (!keys_of_open_objects.back().insert(k).second) {
                problem = depth == 1 ? "tensor '" + k + "' is listed twice in the header"
                                     : "key '" + k + "' appears twice in one object of the header";
                throw std::runtime_error(problem);
            }
            break;
        }
        default: break;
        }
        return true;
    };
    try {
        return json::parse(text.begin(), text.end(), on_event);
    } catch (const json::exception& e) {
        fail<std::runtime_error>(file, std::string("header is not valid JSON: ") + e.what());
    } catch (const std::runtime_error&) {
        if (problem.empty()) throw;
        fail<std::runtime_error>(file, problem);
    }
}

}  // namespace

std::int64_t SafetensorsEntry::numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
}

std::string serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata, bool with_checksum) {
    std::vector<const NamedTensor*> sorted;
    for (const NamedTensor& nt : tensors) {
        if (!nt.tensor.defined()) throw std::invalid_argument("save_safetensors: tensor '" + nt.name + "' is undefined");
        if (nt.name == "__metadata__")
            throw std::invalid_argument("save_safetensors: '__metadata__' is reserved and cannot name a tensor");
        sorted.push_back(&nt);
    }
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
    for (std::size_t i = 1; i < sorted.size(); ++i)
        if (sorted[i]->name == sorted[i - 1]->name)
            throw std::invalid_argument("save_safetensors: two tensors are named '" + sorted[i]->name + "'");

    // The data buffer: each tensor's values as they lie in memory (row-major, little-endian real).
    std::string data;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> offsets;
    for (const NamedTensor* nt : sorted) {
        const std::size_t nbytes = static_cast<std::size_t>(nt->tensor.numel()) * sizeof(real);
        offsets.emplace_back(data.size(), data.size() + nbytes);
        if (nbytes) data.append(reinterpret_cast<const char*>(nt->tensor.data()), nbytes);
    }

    // The header, in the reference implementation's order: "__metadata__" first, then the tensors in
    // the order of their data, each as {"dtype", "shape", "data_offsets"}.
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    std::map<std::string, std::string> meta = metadata;
    if (with_checksum) meta[kSafetensorsChecksumKey] = checksum_str(0);  // a placeholder, filled in below
    if (!meta.empty()) header["__metadata__"] = meta;
    for (std::size_t i = 0; i < sorted.size(); ++i) {
        const Shape& s = sorted[i]->tensor.shape();
        header[sorted[i]->name] = {
            {"dtype", kSafetensorsRealDtype},
            {"shape", std::vector<std::int64_t>(s.dims.begin(), s.dims.begin() + s.rank)},
            {"data_offsets", nlohmann::ordered_json::array({offsets[i].first, offsets[i].second})}};
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {  // a name or metadata string that is not UTF-8
        throw std::invalid_argument(std::string("save_safetensors: ") + e.what());
    }
    // Pad with spaces so that the data starts at a multiple of 8 bytes (8-byte size field + header).
    text.append((8 - text.size() % 8) % 8, ' ');

    std::string bytes;
    bytes.reserve(8 + text.size() + data.size());
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((std::uint64_t(text.size()) >> (8 * i)) & 0xFF));
    bytes += text;
    bytes += data;
    // The checksum covers the whole file, header and metadata included, with its own 8 hex digits read as
    // '0': computed over the bytes with the placeholder, then written into it.
    if (with_checksum) {
        const std::size_t at = checksum_digits_at(std::string_view(bytes).substr(8, text.size()));
        if (at == std::string::npos) throw std::logic_error("save_safetensors: checksum placeholder not found in the header");
        const std::string digits = checksum_str(crc32c(bytes)).substr(7);
        bytes.replace(8 + at, 8, digits);
    }
    return bytes;
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata, bool with_checksum) {
    write_file_atomic(path, serialize_safetensors(tensors, metadata, with_checksum));
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name) {
    // 1. The header size, and the three parts of the file it defines.
    if (bytes.size() < 8)
        fail<std::runtime_error>(name, "file is " + std::to_string(bytes.size()) + " bytes, too short for the 8-byte header size");
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
    const std::uint64_t rest = bytes.size() - 8;
    if (n > rest)
        fail<std::runtime_error>(name, "header size " + std::to_string(n) + " is larger than the " + std::to_string(rest) +
                       " bytes that follow it (truncated file or corrupted size?)");
    if (n > kMaxHeaderSize)
        fail<std::runtime_error>(name, "header size " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeaderSize));
    const std::string_view text = bytes.substr(8, n);
    const std::string_view buffer = bytes.substr(8 + n);

    // 2. The header: metadata strings and one checked entry per tensor.
    const json header = parse_header(name, text);
    if (!header.is_object()) fail<std::runtime_error>(name, "header is " + brief(header) + ", not a JSON object");
    SafetensorsFile file;
    file.path = name;
    std::vector<RawEntry> entries;
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() != "__metadata__") {
            entries.push_back(check_entry(name, it.key(), it.value(), buffer.size()));
            continue;
        }
        if (!it.value().is_object()) fail<std::runtime_error>(name, "__metadata__ is " + brief(it.value()) + ", not an object");
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
            if (!m.value().is_string())
                fail<std::runtime_error>(name, "__metadata__ value of '" + m.key() + "' is " + brief(m.value()) + ", not a string");
            file.metadata[m.key()] = m.value().get<std::string>();
        }
    }

    // 3. The byte ranges, in file order, must tile the buffer: no overlap, no gap, nothing after.
    std::sort(entries.begin(), entries.end(),
              [](const RawEntry& a, const RawEntry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    std::uint64_t pos = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const RawEntry& e = entries[i];
        if (e.begin < pos)
            fail<std::runtime_error>(name, "tensors '" + entries[i - 1].name + "' " + range_str(entries[i - 1].begin, entries[i - 1].end) +
                           " and '" + e.name + "' " + range_str(e.begin, e.end) + " overlap");
        if (e.begin > pos)
            fail<std::runtime_error>(name, "bytes " + range_str(pos, e.begin) + " of the data buffer, before tensor '" + e.name +
                           "', belong to no tensor");
        pos = e.end;
    }
    if (pos != buffer.size())
        fail<std::runtime_error>(name, std::to_string(buffer.size() - pos) + " bytes of trailing data after the last tensor");

    // 4. The checksum, when the file carries one: CRC-32C of the whole file with its own digits read as '0'.
    auto checksum = file.metadata.find(kSafetensorsChecksumKey);
    if (checksum != file.metadata.end()) {
        const std::string& stored = checksum->second;
        if (stored.size() != 15 || stored.compare(0, 7, "crc32c:") != 0 ||
            stored.find_first_not_of("0123456789abcdef", 7) != std::string::npos)
            fail<std::runtime_error>(name, std::string(kSafetensorsChecksumKey) + " is '" + stored + "', not crc32c:<8 hex digits>");
        const std::size_t at = checksum_digits_at(text);
        if (at == std::string::npos)
            fail<std::runtime_error>(name, std::string(kSafetensorsChecksumKey) + " is not stored as tapeformer writes it "
                                           "(the header was rewritten by another program?)");
        std::string head(bytes.substr(0, 8 + n));
        head.replace(8 + at, 8, "00000000");
        if (checksum_str(crc32c(buffer, crc32c(head))) != stored) {
            // Before the checksum covered the header, it covered the data alone: name that case.
            if (checksum_str(crc32c(buffer)) == stored)
                fail<std::runtime_error>(name, "its checksum covers only the tensor data, as older tapeformer versions "
                                               "wrote it, so its metadata cannot be verified; train the model again");
            fail<std::runtime_error>(name, "checksum mismatch: the file was corrupted or edited (header or data)");
        }
    }

    // 5. The values, converted to real.
    for (const RawEntry& e : entries) {
        SafetensorsEntry& out = file.tensors[e.name];
        out.dtype = e.dtype;
        out.shape = e.shape;
        out.values.resize(static_cast<std::size_t>(out.numel()));
        if (!decode(e.dtype, buffer.data() + e.begin, out.numel(), out.values.data()))
            fail<std::runtime_error>(name, "tensor '" + e.name + "' has dtype " + e.dtype + ", which tapeformer cannot convert");
    }
    return file;
}

SafetensorsFile load_safetensors(const std::string& path) { return parse_safetensors(read_file(path), path); }

Tensor SafetensorsFile::tensor(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) fail<std::runtime_error>(path, "no tensor '" + name + "'");
    const SafetensorsEntry& e = it->second;
    if (e.shape.size() > static_cast<std::size_t>(Shape::kMaxRank))
        fail<std::runtime_error>(path, "tensor '" + name + "' has shape " + shape_str(e.shape) + ", more than " +
                       std::to_string(Shape::kMaxRank) + " dimensions");
    return Tensor::from(e.values, Shape::of(e.shape));
}

void load_into(const ParamList& params, const SafetensorsFile& file, bool strict) {
    // Check everything first, so that a failed load leaves the model as it was.
    std::vector<std::pair<Tensor, const SafetensorsEntry*>> copies;
    std::set<std::string> names;
    std::map<const real*, std::pair<std::string, const SafetensorsEntry*>> first_of_storage;  // tied weights
    for (const NamedTensor& p : params) {
        if (!names.insert(p.name).second)
            throw std::invalid_argument("load_into: the parameter list names '" + p.name + "' twice");
        auto it = file.tensors.find(p.name);
        if (it == file.tensors.end()) {
            if (strict) fail<std::runtime_error>(file.path, "missing tensor '" + p.name + "' (the model has it, the file does not)");
            continue;
        }
        const SafetensorsEntry& e = it->second;
        if (!is_floating(e.dtype))
            fail<std::runtime_error>(file.path, "tensor '" + p.name + "' is " + e.dtype + " in the file; a parameter needs F32, F64, F16 or BF16");
        const Shape& s = p.tensor.shape();
        const std::vector<std::int64_t> model_shape(s.dims.begin(), s.dims.begin() + s.rank);
        if (e.shape != model_shape)
            fail<std::runtime_error>(file.path, "shape of '" + p.name + "' is " + shape_str(e.shape) + " in the file, " + s.str() +
                                " in the model");
        // Two names for one tensor (tied weights) load twice into the same memory: the file must agree.
        if (p.tensor.numel() > 0) {
            auto [tied, fresh] = first_of_storage.try_emplace(p.tensor.data(), p.name, &e);
            const std::vector<real>& a = tied->second.second->values;
            if (!fresh && (a.size() != e.values.size() ||  // bitwise, so that NaN == NaN here
                           std::memcmp(a.data(), e.values.data(), a.size() * sizeof(real)) != 0))
                fail<std::runtime_error>(file.path, "'" + tied->second.first + "' and '" + p.name +
                                    "' are one tied tensor in the model but differ in the file");
        }
        copies.emplace_back(p.tensor, &e);
    }
    if (strict)
        for (const auto& [name, e] : file.tensors)
            if (!names.count(name)) fail<std::runtime_error>(file.path, "unexpected tensor '" + name + "' (the file has it, the model does not)");

    for (auto& [t, e] : copies) std::copy(e->values.begin(), e->values.end(), t.data());
}

TF_NAMESPACE_END
