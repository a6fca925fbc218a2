// io.h: CRC-32C against published test vectors and a bit-at-a-time reference; atomic writes that leave
// either the old file or the new one and never a temporary file; reads that name the path on failure.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

#include "tapeformer/io.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

// Names in `dir` that look like our temporary files.
int count_tmp_files(const fs::path& dir) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
    return n;
}

// The CRC-32C definition, one bit at a time: the reference for the table-driven version.
std::uint32_t crc32c_bitwise(const std::string& s) {
    std::uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char c : s) {
        crc ^= c;
        for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

}  // namespace

TEST_CASE("crc32c matches the published test vectors", "[io]") {
    CHECK(tf::crc32c(std::string_view("")) == 0u);
    CHECK(tf::crc32c(std::string_view("123456789")) == 0xE3069283u);
    // RFC 3720 (iSCSI), appendix B.4.
    CHECK(tf::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
    CHECK(tf::crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
    std::string ascending;
    for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
    CHECK(tf::crc32c(ascending) == 0x46DD794Eu);
}

TEST_CASE("crc32c agrees with the bitwise definition at every length and in pieces", "[io]") {
    std::mt19937 rng(7);
    std::string s;
    for (int len = 0; len <= 70; ++len) {
        CHECK(tf::crc32c(s) == crc32c_bitwise(s));
        s.push_back(static_cast<char>(rng() & 0xFF));
    }
    for (std::size_t cut = 0; cut <= s.size(); cut += 5) {
        std::string_view a = std::string_view(s).substr(0, cut), b = std::string_view(s).substr(cut);
        CHECK(tf::crc32c(b, tf::crc32c(a)) == tf::crc32c(s));
    }
}

TEST_CASE("write_file_atomic writes, replaces, and leaves no temporary file", "[io]") {
    TempDir dir;
    const std::string path = dir / "out.bin";
    const std::string bytes("a\0b\xff\n", 5);
    tf::write_file_atomic(path, bytes);
    CHECK(tf::read_file(path) == bytes);
    tf::write_file_atomic(path, "second version");
    CHECK(tf::read_file(path) == "second version");
    tf::write_file_atomic(path, "");
    CHECK(tf::read_file(path).empty());
    CHECK(count_tmp_files(dir.path) == 0);
}

TEST_CASE("write_file_atomic fails cleanly when the parent directory does not exist", "[io]") {
    TempDir dir;
    const std::string path = dir / "no_such_dir/out.bin";
    try {
        tf::write_file_atomic(path, "data");
        FAIL("expected an exception");
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        CHECK_THAT(msg, Catch::Contains(path));
        CHECK_THAT(msg, Catch::Contains("No such file or directory"));
    }
    CHECK(count_tmp_files(dir.path) == 0);
    CHECK_FALSE(fs::exists(dir / "no_such_dir"));
}

TEST_CASE("write_file_atomic leaves the existing file untouched when it cannot write", "[io]") {
    TempDir dir;
    const std::string path = dir / "model.safetensors";
    tf::write_file_atomic(path, "old contents");
    // Block the temporary file's name with a directory: open() fails (as root, permissions would not).
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    fs::create_directory(tmp);
    CHECK_THROWS_WITH(tf::write_file_atomic(path, "new contents"), Catch::Contains(path) && Catch::Contains(tmp));
    CHECK(tf::read_file(path) == "old contents");
    fs::remove(tmp);
    CHECK(count_tmp_files(dir.path) == 0);
}

TEST_CASE("write_file_atomic removes its temporary file when the rename fails", "[io]") {
    TempDir dir;
    // The target becomes a non-empty directory after the writer started (a directory given as the target is
    // refused at once): the temporary file is written, then rename() refuses.
    const std::string path = dir / "target";
    tf::AtomicFile file(path);
    file.write("data");
    fs::create_directory(path);
    tf::write_file_atomic(dir / "target/keep", "x");
    CHECK_THROWS_WITH(file.commit(), Catch::Contains(path) && Catch::Contains("rename"));
    CHECK(count_tmp_files(dir.path) == 0);
    CHECK(tf::read_file(dir / "target/keep") == "x");
}

TEST_CASE("read_file names the path and the reason", "[io]") {
    TempDir dir;
    const std::string missing = dir / "missing.bin";
    CHECK_THROWS_WITH(tf::read_file(missing),
                      Catch::Contains(missing) && Catch::Contains("No such file or directory"));
    CHECK_THROWS_WITH(tf::read_file(dir.path.string()), Catch::Contains("Is a directory"));

    std::string big(200000, '\0');  // larger than one read() chunk
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 % 251);
    tf::write_file_atomic(dir / "big.bin", big);
    CHECK(tf::read_file(dir / "big.bin") == big);
}
