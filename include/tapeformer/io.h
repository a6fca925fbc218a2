// Whole-file reads and crash-safe writes, and the checksum that checkpoints carry.
//
// A checkpoint must never be half-written: write_file_atomic writes a temporary file beside the target,
// flushes it to disk and renames it over the target, so a reader sees either the old file or the new one.
// A device, a FIFO or a symbolic link given as an output is written, never replaced (the rule below).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// Where an output goes. One rule for every file tapeformer writes, applied by AtomicFile and
// write_file_atomic below; it is where `> path` in a shell would write, made crash-safe for files:
//  - "-" is standard output, written straight through (std::cout is flushed first, to keep the order);
//  - a symbolic link is followed, link after link, to the path it finally names (output_target); the
//    link stays, and what it names is written by the rules below (a missing target is created);
//  - a regular file, or nothing, is replaced atomically: the bytes go to `target + ".tmp.<pid>"` in the
//    same directory, which is fsynced and renamed over the target (the directory is fsynced too), so a
//    reader sees the old file or the new one, never half of one; the new file keeps the old one's mode;
//  - a character device (/dev/null, a terminal) or a FIFO is written straight through, never replaced;
//  - a directory, a block device or a socket is refused before anything is written.
// On any failure the temporary file is removed, an existing regular target is left untouched, and
// std::runtime_error names the path and the system's reason.

// The path an output named `path` lands on: `path` with its symbolic links followed to the end ("-" for
// "-"). Throws std::runtime_error naming the path on a link loop or an unreadable link.
std::string output_target(const std::string& path);

// How the rule above applies to `path`, decided once for both the writer and the CLI's check that an output
// is no input (cli/commands.h check_output_path).
struct OutputPlan {
    enum Kind { standard_output, write_through, replace, refused } kind = replace;
    std::string target;      // replace and refused: the path after links; otherwise `path` itself
    bool exists = false;     // replace: the target exists (a regular file, whose permissions the new one keeps)
    unsigned mode = 0;       // replace: those permissions
    std::uint64_t device = 0, inode = 0;  // replace: which file it is, to compare with inputs
    const char* refused_as = "";  // refused: "directory", "block device", "socket" or "special file"
};
OutputPlan plan_output(const std::string& path);

// Writes `bytes` to the output `path`, by the rule above.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The same, written in pieces: for output that should not be held in memory whole (translate streams its
// translations). A file is written to its temporary and commit() renames it into place; straight-through
// outputs (a device, a FIFO, "-") receive each write() as it comes and commit() only closes them. A writer
// destroyed without commit() (an error, an interrupted run) removes its temporary file, leaving an existing
// file untouched. Errors throw std::runtime_error naming the path and the system's reason.
class AtomicFile {
public:
    explicit AtomicFile(std::string path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(std::string_view bytes);
    void commit();
    // The temporary file a crash or a signal would leave behind; "" for a straight-through output.
    const std::string& temp_path() const { return tmp_; }

private:
    [[noreturn]] void fail(const std::string& what, int err);

    std::string path_, target_, tmp_;
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
// A checksum as tapeformer writes it in files: "crc32c:" and 8 lower-case hex digits.
std::string checksum_str(std::uint32_t crc);

TF_NAMESPACE_END
