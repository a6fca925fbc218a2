// Whole-file reads and crash-safe writes, and the checksum that checkpoints carry.
//
// A checkpoint must never be half-written: write_file_atomic writes a temporary file beside the target,
// flushes it to disk and renames it over the target, so a reader sees either the old file or the new one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// Replaces `path` with `bytes`, atomically: writes `path + ".tmp.<pid>"` in the same directory, fsyncs
// it, renames it over `path` and fsyncs the directory. On any failure the temporary file is removed, an
// existing `path` is left untouched, and std::runtime_error names the path and the system's reason.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The same, written in pieces: for output that should not be held in memory whole (translate streams its
// translations). Writes go to `path + ".tmp.<pid>"`; commit() fsyncs it and renames it over `path`. A
// writer destroyed without commit() (an error, an interrupted run) removes its temporary file, leaving an
// existing `path` untouched. Errors throw std::runtime_error naming the path and the system's reason.
class AtomicFile {
public:
    explicit AtomicFile(std::string path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(std::string_view bytes);
    void commit();
    const std::string& temp_path() const { return tmp_; }

private:
    [[noreturn]] void fail(const std::string& what, int err);

    std::string path_, tmp_;
    int fd_ = -1;
};

// The whole content of `path`. Throws std::runtime_error naming the path and the reason.
std::string read_file(const std::string& path);

// One number as printf formats it ("%.4f"), for log lines and tables.
std::string fmt(const char* printf_format, double value);

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected; the checksum of iSCSI, ext4 and SSE4.2's crc32
// instruction). crc32c("123456789") == 0xE3069283. To checksum data in pieces, pass the previous result
// as `crc`: crc32c(b, nb, crc32c(a, na)) == crc32c of a followed by b.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);
inline std::uint32_t crc32c(std::string_view bytes, std::uint32_t crc = 0) {
    return crc32c(bytes.data(), bytes.size(), crc);
}

TF_NAMESPACE_END
