// An MPI rank's console (run/held_lines.h): lines for a pipe whose reader stopped reading wait in memory,
// in order, instead of blocking the rank; as the rank ends, the newest lines go into the half kept free.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "helpers.h"
#include "run/held_lines.h"

using namespace tf;
using tf_test::read_all;
using tf_test::TempDir;

namespace {

// A pipe nobody reads until the test says so. The write end does not block: a write that would have blocked
// fails instead, and the line it carried is missing from what the test reads back.
struct Pipe {
    int read_end = -1, write_end = -1;
    Pipe() {
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        read_end = fds[0], write_end = fds[1];
        ::fcntl(write_end, F_SETFL, ::fcntl(write_end, F_GETFL) | O_NONBLOCK);
        ::fcntl(read_end, F_SETFL, ::fcntl(read_end, F_GETFL) | O_NONBLOCK);
    }
    ~Pipe() {
        ::close(read_end);
        ::close(write_end);
    }
    std::size_t capacity() const { return std::size_t(::fcntl(write_end, F_GETPIPE_SZ)); }
    std::size_t unread() const {
        int n = 0;
        ::ioctl(read_end, FIONREAD, &n);
        return std::size_t(n);
    }
    std::string drain() const {
        std::string out;
        char buf[4096];
        for (ssize_t n; (n = ::read(read_end, buf, sizeof buf)) > 0;) out.append(buf, std::size_t(n));
        return out;
    }
};

std::string line(int i) { return "step " + std::to_string(i) + " | loss 1.2345 | a line as long as a training log's line\n"; }

}  // namespace

TEST_CASE("held lines: a pipe nobody reads fills only to half, and the lines come out in order once it is read", "[io]") {
    Pipe pipe;
    HeldLines held(pipe.write_end);
    std::ostream os(&held);
    std::string expected;
    for (int i = 0; i < 3000; ++i) {  // about 200 KB: three times the pipe
        os << line(i);
        expected += line(i);
    }
    CHECK(pipe.unread() <= pipe.capacity() / 2);
    CHECK(pipe.unread() > pipe.capacity() / 4);
    CHECK(held.held_bytes() == expected.size() - pipe.unread());
    // The reader comes back: every line, in order, none lost.
    std::string got;
    for (int round = 0; round < 100 && held.held_bytes() > 0; ++round) {
        got += pipe.drain();
        os.flush();
    }
    got += pipe.drain();
    CHECK(held.held_bytes() == 0);
    CHECK(held.dropped_lines() == 0);
    CHECK(got == expected);
}

TEST_CASE("held lines: ending while nobody reads puts a count and the newest lines into the free half", "[io]") {
    Pipe pipe;
    HeldLines held(pipe.write_end);
    std::ostream os(&held);
    const int n = 2000;
    for (int i = 0; i < n; ++i) os << line(i);
    os << "interrupted at step " << n << "; checkpoint saved\n";
    held.finish();
    const std::string got = pipe.drain();
    INFO(got.substr(got.size() > 600 ? got.size() - 600 : 0));
    // The first lines as they were written, then the count, then the last lines up to the final one.
    CHECK(got.rfind(line(0), 0) == 0);
    const std::size_t note = got.find("tapeformer: ");
    REQUIRE(note != std::string::npos);
    const std::size_t end_of_note = got.find('\n', note) + 1;
    const int missing = std::stoi(got.substr(note + 12));
    int before = 0, after = 0;
    for (std::size_t at = got.find("step "); at != std::string::npos; at = got.find("step ", at + 1))
        (at < note ? before : after) += got.compare(at, 5, "step ") == 0 && (at == 0 || got[at - 1] == '\n');
    CHECK(before > 0);
    CHECK(after > 0);
    CHECK(before + missing + after == n);
    CHECK(got.compare(end_of_note, line(n - after).size(), line(n - after)) == 0);  // the newest lines, in order
    CHECK(got.size() >= std::string("; checkpoint saved\n").size());
    CHECK(got.substr(got.size() - 19) == "; checkpoint saved\n");
    CHECK(held.held_bytes() == 0);
}

TEST_CASE("held lines: a file (not a pipe) gets every line at once", "[io]") {
    const TempDir tmp;
    const std::string path = tmp / "log.txt";
    std::string expected;
    {
        std::FILE* f = std::fopen(path.c_str(), "w");
        REQUIRE(f);
        HeldLines held(::fileno(f));
        std::ostream os(&held);
        for (int i = 0; i < 3000; ++i) {
            os << line(i);
            expected += line(i);
        }
        CHECK(held.held_bytes() == 0);
        held.finish();
        std::fclose(f);
    }
    CHECK(read_all(path) == expected);
}
