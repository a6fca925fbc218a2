// safetensors.h: round trips, the reference implementation's exact bytes, a file laid out the way
// Python's safetensors writes it (F64 and I64), every kind of malformed file (each must raise one readable
// std::runtime_error and never crash), checksums, and load_into's mismatch messages.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "tapeformer/io.h"
#include "tapeformer/safetensors.h"
#include "helpers.h"

namespace fs = std::filesystem;
using tf::real;

using namespace tf_test;

namespace {

std::string le64(std::uint64_t n) {
    std::string s;
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
    return s;
}

template <typename T>
std::string raw_bytes(const std::vector<T>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// A file by hand: size field, header (padded with spaces to a multiple of 8 unless told not to), data.
std::string assemble(std::string header, const std::string& data, bool pad = true) {
    if (pad) header.append((8 - header.size() % 8) % 8, ' ');
    return le64(header.size()) + header + data;
}

// Two F32 tensors "a" (shape (2, 2)) and "b" (shape (3)): the base of the malformed-file cases.
std::string two_tensor_file(const std::string& a_entry, const std::string& b_entry, const std::string& data) {
    return assemble("{\"a\":" + a_entry + ",\"b\":" + b_entry + "}", data);
}
const std::string kData28 = raw_bytes(std::vector<float>{1, 2, 3, 4, 5, 6, 7});

// The message of the std::runtime_error that parsing `bytes` raises (fails the test if none is raised).
std::string parse_error(const std::string& bytes) {
    try {
        tf::parse_safetensors(bytes, "model.safetensors");
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    FAIL("parse_safetensors accepted a malformed file");
    return "";
}

// Parsing must either succeed or throw std::runtime_error naming the file: any other outcome is a bug.
bool parses_or_fails_cleanly(const std::string& bytes) {
    try {
        tf::parse_safetensors(bytes, "fuzz.safetensors");
        return true;
    } catch (const std::runtime_error& e) {
        return std::string(e.what()).rfind("fuzz.safetensors: ", 0) == 0;
    } catch (...) {
        return false;
    }
}

tf::Tensor iota(const tf::Shape& shape, real start = 0) {
    std::vector<real> v(static_cast<std::size_t>(shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + real(i) * real(0.5);
    return tf::Tensor::from(v, shape);
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, shapes, values and metadata", "[safetensors]") {
    TempDir dir;
    const std::string path = dir / "model.safetensors";
    tf::ParamList tensors = {
        {"encoder.layers.0.norm1.weight", iota({16}, 1)},
        {"decoder.embed.weight", iota({5, 3}, -2)},
        {"scalar", tf::Tensor::scalar(real(3.25))},
        {"rank4", iota({2, 1, 3, 2}, 7)},
        {"empty", tf::Tensor::zeros({0, 3})},
    };
    const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"tapeformer.step", "1200"},
                                                         {"note", "UTF-8 \xc3\xa9t\xc3\xa9"}};
    tf::save_safetensors(path, tensors, metadata);

    tf::SafetensorsFile f = tf::load_safetensors(path);
    CHECK(f.path == path);
    CHECK(f.metadata == metadata);
    REQUIRE(f.tensors.size() == tensors.size());
    for (const tf::NamedTensor& nt : tensors) {
        INFO(nt.name);
        REQUIRE(f.tensors.count(nt.name) == 1);
        const tf::SafetensorsEntry& e = f.tensors.at(nt.name);
        CHECK(e.dtype == tf::kSafetensorsRealDtype);
        CHECK(tf::Shape::of(e.shape) == nt.tensor.shape());
        CHECK(e.values == nt.tensor.to_vector());  // bit-exact: F32 in, F32 out
        CHECK(f.tensor(nt.name).shape() == nt.tensor.shape());
        CHECK(f.tensor(nt.name).to_vector() == nt.tensor.to_vector());
    }
    CHECK_THROWS_WITH(f.tensor("nope"), Catch::Contains("no tensor 'nope'"));
    // Nothing else in the directory: the temporary file was renamed away.
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors layout: sorted by name, data aligned to 8 bytes, metadata first (float32 build)", "[safetensors]") {
    tf::ParamList tensors = {{"zeta", iota({3})}, {"alpha", iota({2, 2})}, {"mid", iota({1})}};
    const std::string bytes = tf::serialize_safetensors(tensors, {{"k", "v"}});
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    CHECK((8 + n) % 8 == 0);
    const std::string header = bytes.substr(8, n);
    CHECK(header.find_last_not_of(' ') + 1 + 8 > header.size());  // at most 7 spaces of padding
    CHECK(header.rfind("{\"__metadata__\":{\"k\":\"v\"},\"alpha\":", 0) == 0);
    const auto j = nlohmann::json::parse(header);
    CHECK(j["alpha"]["data_offsets"] == nlohmann::json::array({0, 16}));
    CHECK(j["mid"]["data_offsets"] == nlohmann::json::array({16, 20}));
    CHECK(j["zeta"]["data_offsets"] == nlohmann::json::array({20, 32}));
    CHECK(bytes.size() == 8 + n + 32);
    // The order of the input does not change the bytes.
    CHECK(tf::serialize_safetensors({tensors[2], tensors[0], tensors[1]}, {{"k", "v"}}) == bytes);
}

TEST_CASE("safetensors bytes match the reference implementation's test vector (float32 build)", "[safetensors]") {
    // safetensors/src/tensor.rs, test_serialization_forced_alignement: "attn0", F32, shape [1, 1, 2, 3],
    // values 0..5 -> header size 72 (65 bytes of JSON and 7 spaces), then the 24 data bytes.
    tf::ParamList tensors = {{"attn0", tf::Tensor::from({0, 1, 2, 3, 4, 5}, {1, 1, 2, 3})}};
    const std::string json = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}";
    const std::string expected = le64(72) + json + std::string(7, ' ') + raw_bytes(std::vector<float>{0, 1, 2, 3, 4, 5});
    CHECK(tf::serialize_safetensors(tensors) == expected);
    // And the empty file: "{}" and 6 spaces.
    CHECK(tf::serialize_safetensors({}) == le64(8) + "{}      ");
    CHECK(tf::parse_safetensors(le64(8) + "{}      ", "empty").tensors.empty());
}

TEST_CASE("safetensors reads a file laid out as Python writes it (I64 and F64, padded)", "[safetensors]") {
    // safetensors.numpy.save_file({"w": float64 (2, 2), "pos": int64 (3,)}, metadata={"format": "np"}):
    // tensors sorted by descending dtype (I64 after F64 in the enum, so first), then by name.
    const std::string header =
        "{\"__metadata__\":{\"format\":\"np\"},"
        "\"pos\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
        "\"w\":{\"dtype\":\"F64\",\"shape\":[2,2],\"data_offsets\":[24,56]}}";
    const std::string data = raw_bytes(std::vector<std::int64_t>{-1, 0, 40000}) +
                             raw_bytes(std::vector<double>{0.5, -1.25, 1e-3, 3.0});
    TempDir dir;
    const std::string path = dir / "python.safetensors";
    tf::write_file_atomic(path, assemble(header, data));

    tf::SafetensorsFile f = tf::load_safetensors(path);
    CHECK(f.metadata == std::map<std::string, std::string>{{"format", "np"}});
    REQUIRE(f.tensors.size() == 2);
    CHECK(f.tensors.at("pos").dtype == "I64");
    CHECK(f.tensors.at("pos").shape == std::vector<std::int64_t>{3});
    CHECK(f.tensors.at("pos").values == std::vector<real>{-1, 0, 40000});
    CHECK(f.tensors.at("w").dtype == "F64");
    CHECK(f.tensors.at("w").shape == std::vector<std::int64_t>{2, 2});
    CHECK(f.tensors.at("w").values == std::vector<real>{real(0.5), real(-1.25), real(1e-3), real(3.0)});

    // The same file without padding (the format allows it: alignment is a convention) also reads.
    CHECK(tf::parse_safetensors(assemble(header, data, false), "unpadded").tensors.size() == 2);
}

TEST_CASE("safetensors converts F16, BF16 and the integer dtypes to real", "[safetensors]") {
    const std::string header =
        "{\"h\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[0,12]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
        "\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[16,24]},"
        "\"u\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[24,26]},"
        "\"t\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[26,28]},"
        "\"s\":{\"dtype\":\"I16\",\"shape\":[],\"data_offsets\":[28,30]}}";
    // F16: 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 2^-14 (smallest normal), +inf.
    const std::string data = raw_bytes(std::vector<std::uint16_t>{0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x7C00}) +
                             raw_bytes(std::vector<std::uint16_t>{0x3F80, 0xC040}) +
                             raw_bytes(std::vector<std::int32_t>{-7, 123456}) + std::string("\xFF\x02", 2) +
                             std::string("\x00\x01", 2) + raw_bytes(std::vector<std::int16_t>{-300});
    tf::SafetensorsFile f = tf::parse_safetensors(assemble(header, data), "mixed");
    const std::vector<real> h = f.tensors.at("h").values;
    CHECK(h[0] == real(1));
    CHECK(h[1] == real(-2));
    CHECK(h[2] == real(65504));
    CHECK(h[3] == real(std::ldexp(1.0, -24)));
    CHECK(h[4] == real(std::ldexp(1.0, -14)));
    CHECK(std::isinf(h[5]));
    CHECK(f.tensors.at("b").values == std::vector<real>{1, -3});
    CHECK(f.tensors.at("i").values == std::vector<real>{-7, 123456});
    CHECK(f.tensors.at("u").values == std::vector<real>{255, 2});
    CHECK(f.tensors.at("t").values == std::vector<real>{0, 1});
    CHECK(f.tensors.at("s").values == std::vector<real>{-300});
    CHECK(f.tensor("s").rank() == 0);

    const std::string f8 = assemble("{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", "\x01");
    CHECK_THAT(parse_error(f8), Catch::Contains("tensor 'q' has dtype F8_E4M3, which tapeformer cannot convert"));
}

TEST_CASE("safetensors rejects truncated files at every cut point", "[safetensors]") {
    tf::ParamList tensors = {{"encoder.w", iota({4, 3})}, {"encoder.b", iota({3})}};
    const std::string bytes = tf::serialize_safetensors(tensors, {{"format", "pt"}});
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
        INFO("cut at " << cut);
        const std::string msg = parse_error(bytes.substr(0, cut));
        CHECK(msg.rfind("model.safetensors: ", 0) == 0);
        CHECK(msg.find('\n') == std::string::npos);
        if (cut < 8) CHECK_THAT(msg, Catch::Contains("too short for the 8-byte header size"));
        else if (cut < 8 + n) CHECK_THAT(msg, Catch::Contains("is larger than the"));
        else CHECK_THAT(msg, Catch::Contains("outside the data buffer"));
    }
}

TEST_CASE("safetensors rejects every bit flip in the header size", "[safetensors]") {
    const std::string bytes = tf::serialize_safetensors({{"w", iota({2, 3})}});
    for (int byte = 0; byte < 8; ++byte)
        for (int bit = 0; bit < 8; ++bit) {
            std::string bad = bytes;
            bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
            INFO("byte " << byte << " bit " << bit << ": " << parse_error(bad));
            CHECK(parse_error(bad).rfind("model.safetensors: ", 0) == 0);
        }
    // All ones: far beyond the file.
    CHECK_THAT(parse_error(le64(~0ull) + "{}"), Catch::Contains("header size 18446744073709551615 is larger than"));
}

TEST_CASE("safetensors rejects malformed headers with a message that says what is wrong", "[safetensors]") {
    const std::string a = "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}";
    const std::string b = "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[16,28]}";
    // The base file is valid.
    CHECK(tf::parse_safetensors(two_tensor_file(a, b, kData28), "ok").tensors.at("b").values == std::vector<real>{5, 6, 7});

    SECTION("garbage JSON") {
        CHECK_THAT(parse_error(assemble("{not json", kData28)), Catch::Contains("header is not valid JSON"));
        CHECK_THAT(parse_error(assemble("", "")), Catch::Contains("header is not valid JSON"));
        CHECK_THAT(parse_error(assemble("{\"a\":1}\x01", "")), Catch::Contains("header is not valid JSON"));
        CHECK_THAT(parse_error(assemble("{\"\xff\":1}", "")), Catch::Contains("header is not valid JSON"));  // not UTF-8
        CHECK_THAT(parse_error(assemble("[1, 2]", "")), Catch::Contains("header is [1,2], not a JSON object"));
        CHECK_THAT(parse_error(assemble(std::string(100, '[') + std::string(100, ']'), "")),
                   Catch::Contains("nested more than 16 deep"));
    }
    SECTION("missing or invalid dtype") {
        CHECK_THAT(parse_error(two_tensor_file("{\"shape\":[2,2],\"data_offsets\":[0,16]}", b, kData28)),
                   Catch::Contains("tensor 'a' has no dtype"));
        CHECK_THAT(parse_error(two_tensor_file("{\"dtype\":\"F33\",\"shape\":[2,2],\"data_offsets\":[0,16]}", b, kData28)),
                   Catch::Contains("tensor 'a' has unknown dtype 'F33'"));
        CHECK_THAT(parse_error(two_tensor_file("{\"dtype\":32,\"shape\":[2,2],\"data_offsets\":[0,16]}", b, kData28)),
                   Catch::Contains("tensor 'a' has dtype 32, not a string"));
        CHECK_THAT(parse_error(two_tensor_file("[1]", b, kData28)), Catch::Contains("tensor 'a' is described by [1]"));
    }
    SECTION("wrong dtype: the byte count no longer matches") {
        CHECK_THAT(parse_error(two_tensor_file("{\"dtype\":\"F64\",\"shape\":[2,2],\"data_offsets\":[0,16]}", b, kData28)),
                   Catch::Contains("tensor 'a' has 16 bytes of data but shape (2, 2) of F64 needs 32"));
    }
    SECTION("shape and offsets that disagree") {
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,28]}", kData28)),
                   Catch::Contains("tensor 'b' has 12 bytes of data but shape (4) of F32 needs 16"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[-3],\"data_offsets\":[16,28]}", kData28)),
                   Catch::Contains("tensor 'b' has shape [-3], not a list of non-negative integers"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[3.0],\"data_offsets\":[16,28]}", kData28)),
                   Catch::Contains("not a list of non-negative integers"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[16,28]}", kData28)),
                   Catch::Contains("tensor 'b' has shape 3, not a list of extents"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"data_offsets\":[16,28]}", kData28)),
                   Catch::Contains("tensor 'b' has no shape"));
        // 2^40 cubed overflows 64 bits: it must not wrap around to a small byte count.
        CHECK_THAT(parse_error(two_tensor_file(
                       a, "{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,1099511627776],\"data_offsets\":[16,28]}",
                       kData28)),
                   Catch::Contains("too large for any file"));
    }
    SECTION("offsets outside the buffer, reversed, malformed or missing") {
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[1000,1012]}", kData28)),
                   Catch::Contains("tensor 'b' has data_offsets [1000, 1012] outside the data buffer of 28 bytes"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[28,16]}", kData28)),
                   Catch::Contains("that end before they begin"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[16]}", kData28)),
                   Catch::Contains("tensor 'b' has data_offsets [16], not [begin, end] in bytes"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[-16,28]}", kData28)),
                   Catch::Contains("not [begin, end] in bytes"));
        CHECK_THAT(parse_error(two_tensor_file(a, "{\"dtype\":\"F32\",\"shape\":[3]}", kData28)),
                   Catch::Contains("tensor 'b' has no data_offsets"));
    }
    SECTION("overlapping offsets, gaps, trailing garbage") {
        const std::string b_overlap = "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]}";
        CHECK_THAT(parse_error(two_tensor_file(a, b_overlap, kData28.substr(0, 24))),
                   Catch::Contains("tensors 'a' [0, 16] and 'b' [12, 24] overlap"));
        const std::string b_same = "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}";
        CHECK_THAT(parse_error(two_tensor_file(a, b_same, kData28.substr(0, 16))), Catch::Contains("overlap"));
        const std::string b_gap = "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[20,28]}";
        CHECK_THAT(parse_error(two_tensor_file(a, b_gap, kData28)),
                   Catch::Contains("bytes [16, 20] of the data buffer, before tensor 'b', belong to no tensor"));
        CHECK_THAT(parse_error(two_tensor_file(a, b, kData28 + "junk")),
                   Catch::Contains("4 bytes of trailing data after the last tensor"));
        CHECK_THAT(parse_error(assemble("{}", "x")), Catch::Contains("1 bytes of trailing data"));
    }
    SECTION("duplicate names and bad metadata") {
        CHECK_THAT(parse_error(assemble("{\"a\":" + a + ",\"a\":" + a + "}", kData28.substr(0, 16))),
                   Catch::Contains("tensor 'a' is listed twice in the header"));
        CHECK_THAT(parse_error(assemble("{\"__metadata__\":{\"epoch\":3},\"a\":" + a + "}", kData28.substr(0, 16))),
                   Catch::Contains("__metadata__ value of 'epoch' is 3, not a string"));
        CHECK_THAT(parse_error(assemble("{\"__metadata__\":[\"x\"],\"a\":" + a + "}", kData28.substr(0, 16))),
                   Catch::Contains("__metadata__ is [\"x\"], not an object"));
    }
}

TEST_CASE("safetensors never crashes on random bytes or random corruptions", "[safetensors]") {
    std::mt19937 rng(12345);
    auto byte = [&] { return static_cast<char>(rng() & 0xFF); };
    for (int i = 0; i < 300; ++i) {
        std::string junk(rng() % 64, '\0');
        for (char& c : junk) c = byte();
        CHECK(parses_or_fails_cleanly(junk));
        // A plausible header size in front of junk gets past the first check.
        CHECK(parses_or_fails_cleanly(le64(junk.size()) + junk));
    }
    const std::string good = tf::serialize_safetensors({{"w", iota({3, 2})}, {"b", iota({2})}}, {{"k", "v"}}, true);
    int accepted = 0;
    for (int i = 0; i < 3000; ++i) {
        std::string bad = good;
        for (int k = 1 + rng() % 3; k > 0; --k) bad[rng() % bad.size()] = byte();
        if (rng() % 4 == 0) bad.resize(rng() % bad.size());
        bool ok = parses_or_fails_cleanly(bad);
        if (!ok) FAIL_CHECK("a corrupted file raised something other than a runtime_error naming it");
        try {
            tf::parse_safetensors(bad, "x");
            ++accepted;  // a change in the header's padding spaces, or to the same byte
        } catch (const std::runtime_error&) {
        }
    }
    CHECK(accepted < 300);  // the checksum catches changed data: few corruptions get through
}

TEST_CASE("safetensors checksum is stored when asked and catches a flipped data byte", "[safetensors]") {
    TempDir dir;
    const std::string path = dir / "model.safetensors";
    tf::ParamList tensors = {{"w", iota({4, 4})}, {"b", iota({4})}};
    tf::save_safetensors(path, tensors, {{"format", "pt"}}, /*with_checksum=*/true);
    tf::SafetensorsFile f = tf::load_safetensors(path);
    REQUIRE(f.metadata.count(tf::kSafetensorsChecksumKey) == 1);
    CHECK(f.metadata.at(tf::kSafetensorsChecksumKey).rfind("crc32c:", 0) == 0);
    CHECK(f.metadata.at("format") == "pt");

    std::string bytes = tf::read_file(path);
    bytes[bytes.size() - 5] ^= 0x01;  // one bit of one value
    tf::write_file_atomic(path, bytes);
    CHECK_THROWS_WITH(tf::load_safetensors(path), path + ": checksum mismatch: the file was corrupted or edited (header or data)");

    // The checksum covers the header too: a metadata value or a shape edited in place is caught.
    const std::string good = tf::serialize_safetensors(tensors, {{"format", "pt"}}, /*with_checksum=*/true);
    std::string edited = good;
    edited.replace(edited.find("\"pt\""), 4, "\"px\"");
    CHECK_THAT(parse_error(edited), Catch::Contains("checksum mismatch"));
    edited = good;
    edited.replace(edited.find("[4,4]"), 5, "[2,8]");
    CHECK_THAT(parse_error(edited), Catch::Contains("checksum mismatch"));
    CHECK_NOTHROW(tf::parse_safetensors(good, "good"));

    // Without a checksum the same flip goes unnoticed: a value has silently changed.
    std::string plain = tf::serialize_safetensors(tensors);
    plain[plain.size() - 5] ^= 0x01;
    CHECK_NOTHROW(tf::parse_safetensors(plain, "plain"));

    // A checksum entry we cannot read is an error, not a silent skip.
    const std::string odd = assemble("{\"__metadata__\":{\"tapeformer.checksum\":\"md5:abc\"}}", "");
    CHECK_THAT(parse_error(odd), Catch::Contains("tapeformer.checksum is 'md5:abc', not crc32c:<8 hex digits>"));
}

TEST_CASE("save_safetensors refuses undefined, duplicate and reserved names", "[safetensors]") {
    CHECK_THROWS_AS(tf::serialize_safetensors({{"w", tf::Tensor()}}), std::invalid_argument);
    CHECK_THROWS_WITH(tf::serialize_safetensors({{"w", iota({2})}, {"w", iota({3})}}),
                      Catch::Contains("two tensors are named 'w'"));
    CHECK_THROWS_WITH(tf::serialize_safetensors({{"__metadata__", iota({2})}}), Catch::Contains("reserved"));
    CHECK_THROWS_AS(tf::serialize_safetensors({{"bad\xff", iota({2})}}), std::invalid_argument);
}

TEST_CASE("load_into copies values and names the first mismatch", "[safetensors]") {
    TempDir dir;
    const std::string path = dir / "model.safetensors";
    tf::save_safetensors(path, {{"enc.w", iota({2, 3}, 1)}, {"enc.b", iota({3}, 10)}});
    const tf::SafetensorsFile f = tf::load_safetensors(path);

    SECTION("matching parameters receive the file's values") {
        tf::ParamList params = {{"enc.w", tf::Tensor::zeros({2, 3})}, {"enc.b", tf::Tensor::zeros({3})}};
        tf::load_into(params, f);
        CHECK(params[0].tensor.to_vector() == iota({2, 3}, 1).to_vector());
        CHECK(params[1].tensor.to_vector() == iota({3}, 10).to_vector());
    }
    SECTION("missing tensor") {
        tf::ParamList params = {{"enc.w", tf::Tensor::zeros({2, 3})}, {"enc.b", tf::Tensor::zeros({3})},
                                {"dec.w", tf::Tensor::zeros({1})}};
        CHECK_THROWS_WITH(tf::load_into(params, f), Catch::Contains(path + ": missing tensor 'dec.w'"));
        CHECK(params[0].tensor.to_vector() == std::vector<real>(6, 0));  // nothing copied on failure
        tf::load_into(params, f, /*strict=*/false);
        CHECK(params[0].tensor.to_vector() == iota({2, 3}, 1).to_vector());
        CHECK(params[2].tensor.to_vector() == std::vector<real>{0});
    }
    SECTION("unexpected tensor") {
        tf::ParamList params = {{"enc.w", tf::Tensor::zeros({2, 3})}};
        CHECK_THROWS_WITH(tf::load_into(params, f), Catch::Contains("unexpected tensor 'enc.b'"));
        CHECK_NOTHROW(tf::load_into(params, f, /*strict=*/false));
    }
    SECTION("shape mismatch, strict or not") {
        tf::ParamList params = {{"enc.w", tf::Tensor::zeros({3, 2})}, {"enc.b", tf::Tensor::zeros({3})}};
        CHECK_THROWS_WITH(tf::load_into(params, f),
                          path + ": shape of 'enc.w' is (2, 3) in the file, (3, 2) in the model");
        CHECK_THROWS_WITH(tf::load_into(params, f, false), Catch::Contains("shape of 'enc.w'"));
    }
    SECTION("integer tensors cannot load into parameters") {
        const std::string header = "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}";
        tf::SafetensorsFile ints = tf::parse_safetensors(assemble(header, raw_bytes(std::vector<std::int64_t>{1, 2})), "ids.st");
        CHECK_THROWS_WITH(tf::load_into({{"ids", tf::Tensor::zeros({2})}}, ints),
                          Catch::Contains("ids.st: tensor 'ids' is I64 in the file"));
    }
}

TEST_CASE("tied weights are written under each name and load back into one tensor", "[safetensors]") {
    tf::Tensor shared = iota({4, 2}, 3);
    tf::ParamList params = {{"decoder.embed.weight", shared}, {"generator.weight", shared}};
    const std::string bytes = tf::serialize_safetensors(params);
    tf::SafetensorsFile f = tf::parse_safetensors(bytes, "tied");
    REQUIRE(f.tensors.size() == 2);
    CHECK(f.tensors.at("generator.weight").values == shared.to_vector());

    tf::Tensor fresh = tf::Tensor::zeros({4, 2});
    tf::load_into({{"decoder.embed.weight", fresh}, {"generator.weight", fresh}}, f);
    CHECK(fresh.to_vector() == shared.to_vector());

    // A file where the two names disagree cannot be loaded into one tensor without losing one of them.
    tf::SafetensorsFile split = tf::parse_safetensors(
        tf::serialize_safetensors({{"decoder.embed.weight", iota({4, 2})}, {"generator.weight", iota({4, 2}, 1)}}), "split");
    CHECK_THROWS_WITH(tf::load_into({{"decoder.embed.weight", fresh}, {"generator.weight", fresh}}, split),
                      Catch::Contains("'decoder.embed.weight' and 'generator.weight' are one tied tensor"));
}
