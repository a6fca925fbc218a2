// File I/O with POSIX calls (so that failures carry errno), and a table-driven CRC-32C. See io.h.
#include "tapeformer/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <utility>

TF_NAMESPACE_BEGIN

namespace {

std::string reason(int err) { return std::strerror(err); }

// The directory that holds `path` ("." for a bare file name), for the fsync that makes a rename durable.
std::string parent_dir(const std::string& path) {
    std::size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

// Writes all of `bytes` to `fd`, retrying short writes and interruptions. Returns 0 or an errno value.
int write_all(int fd, std::string_view bytes) {
    const char* p = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
        ssize_t n = ::write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        p += n;
        left -= static_cast<std::size_t>(n);
    }
    return 0;
}

}  // namespace

std::string output_target(const std::string& path) {
    if (path == "-") return path;
    std::string p = path;
    for (int links = 0;; ++links) {
        struct stat st {};
        // Missing, or not a link: the output lands here (a missing parent or a denied access is the open's to report).
        if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
        if (links == 40) throw std::runtime_error("cannot write '" + path + "': " + reason(ELOOP));
        std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
        const ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
        if (n < 0) throw std::runtime_error("cannot write '" + path + "': cannot read the link '" + p + "': " + reason(errno));
        link.resize(static_cast<std::size_t>(n));
        if (link.empty()) throw std::runtime_error("cannot write '" + path + "': the link '" + p + "' is empty");
        if (link[0] != '/') {  // relative to the directory that holds the link
            const std::string dir = parent_dir(p);
            link = (dir == "/" ? dir : dir + "/") + link;
        }
        p = link;
    }
}

OutputPlan plan_output(const std::string& path) {
    OutputPlan plan;
    if (path == "-") {
        plan.kind = OutputPlan::standard_output;
        plan.target = path;
        return plan;
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
        // Written straight through: a rename would put a regular file in the device's or the FIFO's place.
        plan.kind = OutputPlan::write_through;
        plan.target = path;
        return plan;
    }
    plan.target = output_target(path);
    plan.exists = ::stat(plan.target.c_str(), &st) == 0;
    if (plan.exists && !S_ISREG(st.st_mode)) {
        plan.kind = OutputPlan::refused;
        plan.refused_as = S_ISDIR(st.st_mode)    ? "directory"
                          : S_ISBLK(st.st_mode)  ? "block device"
                          : S_ISSOCK(st.st_mode) ? "socket"
                                                 : "special file";
        return plan;
    }
    if (plan.exists) {
        plan.mode = unsigned(st.st_mode & 07777);
        plan.device = std::uint64_t(st.st_dev);
        plan.inode = std::uint64_t(st.st_ino);
    }
    return plan;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
    const OutputPlan plan = plan_output(path_);
    target_ = plan.target;
    switch (plan.kind) {
        case OutputPlan::standard_output:
            // Whatever the command printed through std::cout or stdio goes out first.
            std::cout.flush();
            std::fflush(stdout);
            fd_ = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0);
            if (fd_ < 0) fail("standard output is not open", errno);
            return;
        case OutputPlan::write_through:
            // Opened by the given name, so that the kernel follows /dev/stdout -> /proc/self/fd/1 -> pipe:[N].
            fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
            if (fd_ < 0) fail("cannot open it", errno);
            return;
        case OutputPlan::refused:
            if (std::string(plan.refused_as) == "directory") fail("'" + target_ + "' is a directory", EISDIR);
            throw std::runtime_error("cannot write '" + path_ + "': '" + target_ + "' is a " + plan.refused_as +
                                     "; an output is a file, a character device, a FIFO or - (standard output)");
        case OutputPlan::replace:
            break;
    }
    tmp_ = target_ + ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) fail("cannot create temporary file '" + tmp_ + "'", errno);
    // The replacement keeps the replaced file's permissions (a private file stays private).
    if (plan.exists && ::fchmod(fd_, mode_t(plan.mode)) != 0) fail("cannot set the mode of '" + tmp_ + "'", errno);
}

AtomicFile::~AtomicFile() {
    if (fd_ < 0) return;  // committed, or failed and cleaned up
    ::close(fd_);
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const std::string& what, int err) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) ::unlink(tmp_.c_str());  // nothing to do if it was never created
    throw std::runtime_error("cannot write '" + path_ + "': " + what + ": " + reason(err));
}

void AtomicFile::write(std::string_view bytes) {
    if (int err = write_all(fd_, bytes)) fail(tmp_.empty() ? "write failed" : "write to '" + tmp_ + "' failed", err);
}

void AtomicFile::commit() {
    if (tmp_.empty()) {  // straight through: the bytes are out; a device may still report an error on close
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) throw std::runtime_error("cannot write '" + path_ + "': close failed: " + reason(errno));
        return;
    }
    // fsync before rename: otherwise a crash can leave the new name pointing at an empty file.
    if (::fsync(fd_) != 0) fail("fsync of '" + tmp_ + "' failed", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        throw std::runtime_error("cannot write '" + path_ + "': close of '" + tmp_ + "' failed: " + reason(err));
    }
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        throw std::runtime_error("cannot write '" + path_ + "': rename from '" + tmp_ + "' failed: " + reason(err));
    }

    // The rename lives in the directory: fsync it so that the new name survives a crash. Some file
    // systems cannot fsync a directory (EINVAL); the file itself is already safe there.
    const std::string dir = parent_dir(target_);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        throw std::runtime_error("cannot write '" + path_ + "': cannot open directory '" + dir +
                                 "' to fsync it: " + reason(errno));
    if (::fsync(dfd) != 0 && errno != EINVAL) {
        int err = errno;
        ::close(dfd);
        throw std::runtime_error("cannot write '" + path_ + "': fsync of directory '" + dir + "' failed: " + reason(err));
    }
    ::close(dfd);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    AtomicFile file(path);
    file.write(bytes);
    file.commit();
}

std::string fmt(const char* printf_format, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, printf_format, value);
    return buf;
}

std::string read_file(const std::string& path) {
    auto fail = [&](int err) -> void {
        throw std::runtime_error("cannot read '" + path + "': " + reason(err));
    };
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        fail(err);
    }
    if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        fail(EISDIR);
    }
    std::string bytes;
    if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<std::size_t>(st.st_size));
    // Read until end of file rather than trusting st_size: the file may change while we read it.
    char chunk[1 << 16];
    for (;;) {
        ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            fail(err);
        }
        if (n == 0) break;
        bytes.append(chunk, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return bytes;
}

// CRC-32C, "slicing by 8": table[0] is the classic byte-at-a-time table for the reflected polynomial
// 0x82F63B78; table[k][b] is the CRC of byte b followed by k zero bytes. One step then folds eight input
// bytes with eight independent lookups instead of eight dependent ones (about 1 byte per cycle).
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;

static CrcTables make_crc_tables() {
    CrcTables t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t c = b;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k)
        for (int b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    return t;
}

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
    static const CrcTables t = make_crc_tables();
    const unsigned char* p = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (; size >= 8; p += 8, size -= 8) {
        std::uint32_t lo = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                  std::uint32_t(p[3]) << 24);
        crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
              t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    }
    for (; size > 0; ++p, --size) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

std::string checksum_str(std::uint32_t crc) {
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc);
    return std::string("crc32c:") + hex;
}

TF_NAMESPACE_END
