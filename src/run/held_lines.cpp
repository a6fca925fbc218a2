// HeldLines (held_lines.h): lines wait in memory while the pipe they go to is more than half full.
#include "run/held_lines.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

TF_NAMESPACE_BEGIN

HeldLines::HeldLines(int fd) : fd_(fd) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
        const int size = ::fcntl(fd, F_GETPIPE_SZ);
        if (size > 0) capacity_ = std::size_t(size);
    }
}

std::size_t HeldLines::unread() const {
    int n = 0;  // FIONREAD counts a pipe's unread bytes from either end
    return capacity_ && ::ioctl(fd_, FIONREAD, &n) == 0 && n > 0 ? std::size_t(n) : 0;
}

bool HeldLines::write_all(const std::string& line) {
    for (std::size_t done = 0; done < line.size();) {
        const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;  // the reader is gone, or (finish) the pipe is full
        done += std::size_t(n);
    }
    return true;
}

void HeldLines::send_what_fits() {
    while (!held_.empty()) {
        const std::string& line = held_.front();
        // A line longer than half the pipe goes once the pipe is empty.
        const std::size_t waiting = unread();
        if (waiting > 0 && waiting + line.size() > capacity_ / 2) return;
        write_all(line);
        held_bytes_ -= line.size();
        held_.pop_front();
    }
}

void HeldLines::end_line() {
    held_bytes_ += partial_.size();
    held_.push_back(std::move(partial_));
    partial_.clear();
    while (held_bytes_ > max_held && held_.size() > 1) {
        held_bytes_ -= held_.front().size();
        held_.pop_front();
        ++dropped_;
    }
    send_what_fits();
}

HeldLines::int_type HeldLines::overflow(int_type c) {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const std::lock_guard<std::mutex> lock(mutex_);
    partial_ += traits_type::to_char_type(c);
    if (c == '\n') end_line();
    return c;
}

std::streamsize HeldLines::xsputn(const char* s, std::streamsize n) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (std::streamsize i = 0; i < n; ++i) {
        partial_ += s[i];
        if (s[i] == '\n') end_line();
    }
    return n;
}

int HeldLines::sync() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!partial_.empty()) end_line();
    else send_what_fits();
    return 0;
}

std::size_t HeldLines::held_bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return held_bytes_;
}

std::size_t HeldLines::dropped_lines() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return dropped_;
}

void HeldLines::finish() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!partial_.empty()) end_line();
    // A reader that is reading makes room within moments; one that sleeps (mpirun ending the job) does not.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (!held_.empty() && std::chrono::steady_clock::now() < deadline) {
        send_what_fits();
        if (!held_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (held_.empty() && dropped_ == 0) return;
    // The newest lines that fit in the room left (the half kept free), after a line saying what is missing.
    // A pipe holds pages, and a line that does not fit in the last page's rest starts a new one: a quarter
    // of the pipe is left for that slack. The writes do not block: a line that finds no room is not written.
    const std::size_t margin = capacity_ / 4 + 256;
    const std::size_t room = capacity_ > unread() + margin ? capacity_ - unread() - margin : 0;
    std::size_t keep = 0, bytes = 0;
    while (keep < held_.size() && bytes + held_[held_.size() - 1 - keep].size() <= room) {
        bytes += held_[held_.size() - 1 - keep].size();
        ++keep;
    }
    const std::size_t missing = dropped_ + held_.size() - keep;
    const int flags = ::fcntl(fd_, F_GETFL);
    ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    bool written = missing == 0 || write_all("tapeformer: " + std::to_string(missing) + " line" + (missing == 1 ? "" : "s") +
                                             " of output not shown: nothing read them (the run's metrics.jsonl has every step)\n");
    for (std::size_t i = held_.size() - keep; written && i < held_.size(); ++i) written = write_all(held_[i]);
    ::fcntl(fd_, F_SETFL, flags);
    held_.clear();
    held_bytes_ = 0;
}

TF_NAMESPACE_END
