// An MPI rank's console: lines for a pipe whose reader may stop reading. Private to run/: the MPI world
// (distributed.cpp) puts it under std::cerr and std::cout of a job's ranks.
//
// Why: after Ctrl-C, mpirun (OpenMPI 4.1) sends the ranks SIGCONT, sleeps odls_base_sigkill_timeout seconds
// (1 by default) without reading their output, sends SIGTERM, sleeps again and sends SIGKILL. A rank that
// logs a line a step fills the 64 KiB pipe within that first sleep and then blocks in write(): it never
// reaches the step at which it would stop and save, and SIGKILL ends it. So lines are handed to the pipe
// only while it is at most half full; the others wait here, in order, and go as soon as there is room. The
// other half stays free for the lines a rank writes as it ends ("checkpoint saved. Resume with ...").
#pragma once
#include <cstddef>
#include <deque>
#include <mutex>
#include <streambuf>
#include <string>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

class HeldLines : public std::streambuf {
public:
    // fd: where the lines go. When it is not a pipe (a file, a terminal), every line goes at once.
    explicit HeldLines(int fd);
    // The lines still held, after a short wait for room: those that fit in the room left go, newest kept,
    // after one line that says how many did not. Call at exit.
    void finish();
    std::size_t held_bytes() const;
    std::size_t dropped_lines() const;

    static constexpr std::size_t max_held = std::size_t(8) << 20;  // beyond this, the oldest held lines go

protected:
    int_type overflow(int_type c) override;
    std::streamsize xsputn(const char* s, std::streamsize n) override;
    int sync() override;

private:
    void end_line();            // the partial line becomes a held line
    void send_what_fits();      // held lines, oldest first, while the pipe stays at most half full
    std::size_t unread() const; // bytes in the pipe its reader has not read yet
    bool write_all(const std::string& line);  // false when it could not (all of it)

    int fd_;
    std::size_t capacity_ = 0;  // the pipe's size (F_GETPIPE_SZ); 0: not a pipe
    std::string partial_;       // the line being written
    std::deque<std::string> held_;
    std::size_t held_bytes_ = 0;
    std::size_t dropped_ = 0;
    mutable std::mutex mutex_;
};

TF_NAMESPACE_END
