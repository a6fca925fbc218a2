// Tensor and Shape: extents, views, factories and the caching pool behind every buffer (tensor.h, pool.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "tapeformer/pool.h"
#include "tapeformer/tensor.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

namespace {

// The message of the std::invalid_argument that f throws ("" when it throws nothing).
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("Shape: rank, numel, negative indices and str", "[tensor]") {
    Shape s{2, 3, 4};
    CHECK(s.rank == 3);
    CHECK(s.numel() == 24);
    CHECK(s[0] == 2);
    CHECK(s[-1] == 4);
    CHECK(s[-3] == 2);
    CHECK(s.last() == 4);
    CHECK(s.leading() == 6);
    CHECK(s.str() == "(2, 3, 4)");
    CHECK_THROWS_AS(s[3], std::invalid_argument);
    CHECK_THROWS_AS(s[-4], std::invalid_argument);

    s[-2] = 5;  // writable through a negative index
    CHECK(s == Shape{2, 5, 4});
    CHECK(s != Shape{2, 3, 4});
    CHECK(Shape{2, 3} != Shape{2, 3, 1});

    Shape scalar;
    CHECK(scalar.rank == 0);
    CHECK(scalar.numel() == 1);
    CHECK(scalar.str() == "()");
    CHECK(Shape::of({7, 1, 2, 3}).str() == "(7, 1, 2, 3)");
    CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5}), std::invalid_argument);
    CHECK_THROWS_AS(Shape::of({1, 2, 3, 4, 5}), std::invalid_argument);
}

TEST_CASE("Tensor: zeros, full, from, scalar and item", "[tensor]") {
    Tensor z = Tensor::zeros({2, 3});
    CHECK(z.shape() == Shape{2, 3});
    CHECK(z.rank() == 2);
    CHECK(z.numel() == 6);
    CHECK(z.size(-1) == 3);
    CHECK(z.to_vector() == std::vector<real>(6, real(0)));

    Tensor f = Tensor::full({4}, real(2.5));
    CHECK(f.to_vector() == std::vector<real>(4, real(2.5)));

    Tensor t = Tensor::from({1, 2, 3, 4, 5, 6}, {3, 2});
    CHECK(t.shape() == Shape{3, 2});
    CHECK(t.to_vector() == std::vector<real>{1, 2, 3, 4, 5, 6});
    CHECK(t.data()[3] == real(4));  // row-major: element (1, 1)

    const std::string msg = error_of([] { Tensor::from({1, 2, 3}, {2, 2}); });
    CHECK_THAT(msg, Catch::Contains("Tensor::from") && Catch::Contains("(2, 2)"));

    CHECK(Tensor::scalar(real(-3)).item() == real(-3));
    CHECK(Tensor::from({7}, {1, 1}).item() == real(7));  // one element, any shape
    const std::string item_msg = error_of([&] { t.item(); });
    CHECK_THAT(item_msg, Catch::Contains("item") && Catch::Contains("(3, 2)"));

    CHECK_FALSE(Tensor().defined());
    CHECK(t.defined());
    CHECK_THROWS_AS(Tensor::zeros({2, -1}), std::invalid_argument);
}

TEST_CASE("Tensor: copies alias, clone does not", "[tensor]") {
    Tensor a = Tensor::from({1, 2, 3}, {3});
    Tensor alias = a;
    Tensor copy = a.clone();
    a.data()[0] = 10;
    CHECK(alias.data()[0] == real(10));
    CHECK(alias.same_storage(a));
    CHECK(copy.data()[0] == real(1));
    CHECK_FALSE(copy.same_storage(a));
}

TEST_CASE("Tensor: reshape is a view sharing values and gradient", "[tensor]") {
    Tensor a = Tensor::from({0, 1, 2, 3, 4, 5}, {2, 3});
    a.set_requires_grad();
    Tensor v = a.reshape({3, 2});
    CHECK(v.shape() == Shape{3, 2});
    CHECK(v.same_storage(a));
    CHECK(v.requires_grad());

    v.data()[5] = 50;  // written through the view, seen by the original
    CHECK(a.data()[5] == real(50));

    v.grad()[1] = 7;  // the gradient buffer is shared too, whichever handle allocated it
    REQUIRE(a.has_grad());
    CHECK(a.grad_vector() == std::vector<real>{0, 7, 0, 0, 0, 0});
    a.zero_grad();
    CHECK(v.grad_vector() == std::vector<real>(6, real(0)));
}

TEST_CASE("Tensor: reshape infers one -1 extent", "[tensor]") {
    Tensor a = Tensor::zeros({2, 3, 4});
    CHECK(a.reshape({-1, 4}).shape() == Shape{6, 4});
    CHECK(a.reshape({2, -1}).shape() == Shape{2, 12});
    CHECK(a.reshape({-1}).shape() == Shape{24});
    CHECK(a.reshape({1, 2, -1, 3}).shape() == Shape{1, 2, 4, 3});
    CHECK(Tensor::scalar(1).reshape({-1}).shape() == Shape{1});
}

TEST_CASE("Tensor: an invalid reshape throws naming both shapes", "[tensor]") {
    Tensor a = Tensor::zeros({2, 3, 4});
    const std::string msg = error_of([&] { a.reshape({5, 5}); });
    CHECK_THAT(msg, Catch::Contains("reshape") && Catch::Contains("(2, 3, 4)") && Catch::Contains("(5, 5)"));

    const std::string infer_msg = error_of([&] { a.reshape({5, -1}); });  // 24 is not a multiple of 5
    CHECK_THAT(infer_msg, Catch::Contains("(2, 3, 4)") && Catch::Contains("(5, -1)"));

    CHECK_THROWS_AS(a.reshape({-1, -1}), std::invalid_argument);
    // Negative extents other than the one inferred -1 are never valid, even when their product matches.
    CHECK_THROWS_AS(a.reshape({-2, -12}), std::invalid_argument);
    CHECK_THROWS_AS(a.reshape({-4, 3, -2}), std::invalid_argument);
    // An empty tensor leaves a -1 undetermined.
    CHECK_THROWS_AS(Tensor::zeros({0, 3}).reshape({0, -1}), std::invalid_argument);
    CHECK(Tensor::zeros({0, 3}).reshape({3, 0}).shape() == Shape{3, 0});
}

TEST_CASE("Tensor: gradient buffers are allocated on first use and zeroed", "[tensor]") {
    Tensor a = Tensor::full({5}, real(1));
    CHECK_FALSE(a.has_grad());
    CHECK(a.grad_vector() == std::vector<real>(5, real(0)));  // zeros without allocating
    CHECK_FALSE(a.has_grad());
    real* g = a.grad();
    CHECK(a.has_grad());
    for (int i = 0; i < 5; ++i) CHECK(g[i] == real(0));
    g[2] = 3;
    a.zero_grad();
    CHECK(a.grad() == g);  // zero_grad keeps the buffer
    CHECK(a.grad_vector() == std::vector<real>(5, real(0)));
}

TEST_CASE("Tensor: grad_target hands out a gradient not yet written to be overwritten, and nothing else", "[tensor]") {
    Tensor a = Tensor::full({2, 3}, real(1));
    tf::GradTarget t = a.grad_target();  // no buffer yet: allocated, not zeroed
    CHECK(t.overwrite);
    CHECK(t.beta() == real(0));
    std::fill(t.data, t.data + 6, real(2));
    t = a.grad_target();  // written: to be added to
    CHECK_FALSE(t.overwrite);
    CHECK(t.beta() == real(1));
    real* kept = a.grad();
    a.zero_grad();  // stale: reads as zeros, and an op may overwrite it, in the same buffer
    CHECK(a.grad_vector() == std::vector<real>(6, real(0)));
    a.zero_grad();
    t = a.grad_target();
    CHECK(t.overwrite);
    CHECK(t.data == kept);
    t.data[0] = 5;
    // A view of part of the storage is never overwritten: the rest of the buffer would be left unwritten.
    a.zero_grad();
    tf::GradTarget row = a.rows(1, 2).grad_target();
    CHECK_FALSE(row.overwrite);
    CHECK(a.grad_vector() == std::vector<real>(6, real(0)));
    CHECK(a.reshape({6}).grad_target().overwrite == false);  // the whole storage, but no longer stale
}

TEST_CASE("Tensor: dropped values go back to the pool and return through recompute_with, and without it a read throws",
          "[tensor]") {
    Tensor y = Tensor::full({3, 50}, real(2));
    y.mark_non_leaf();  // as an op's output
    y.grad()[0] = real(5);
    CHECK_FALSE(y.recomputable());
    y.recompute_with([](real* values) { std::fill(values, values + 150, real(2)); });
    CHECK(y.recomputable());
    const std::size_t asked = tf::pool_stats().bytes_asked;
    y.drop_values();
    CHECK(y.values_dropped());
    CHECK(tf::pool_stats().bytes_asked == asked - 150 * sizeof(real));  // the values' buffer, not the gradient's
    CHECK(y.grad_vector()[0] == real(5));
    const Tensor row = y.rows(1, 2);  // a view reads its part of the recomputed storage
    CHECK(row.to_vector() == std::vector<real>(50, real(2)));
    CHECK_FALSE(y.values_dropped());
    CHECK(tf::pool_stats().bytes_asked == asked);

    Tensor spent = Tensor::full({4}, real(1));
    spent.mark_non_leaf();
    spent.drop_values();
    CHECK_THROWS_AS(spent.data(), std::logic_error);
    Tensor leaf = Tensor::full({4}, real(1));  // a user's tensor is never dropped
    CHECK_THROWS_AS(leaf.drop_values(), std::logic_error);
    CHECK(leaf.to_vector() == std::vector<real>(4, real(1)));
}

TEST_CASE("Pool: a freed buffer is re-used for the same size", "[tensor]") {
    const Shape shape{37, 129};  // an unusual size: nothing else in the tests holds buffers of it
    { Tensor first = Tensor::zeros(shape); }  // freed: its buffer now waits in the pool
    const tf::PoolStats before = tf::pool_stats();
    { Tensor again = Tensor::full(shape, real(1)); }
    CHECK(tf::pool_stats().system_allocations == before.system_allocations);

    // A value buffer and a gradient buffer of the same size: after one round both are cached, and
    // every later round (a training step) asks the system for nothing.
    {
        Tensor warm = Tensor::zeros(shape);
        warm.grad()[0] = 1;
    }
    const tf::PoolStats steady = tf::pool_stats();
    for (int i = 0; i < 10; ++i) {
        Tensor t = Tensor::full(shape, real(i));
        t.grad()[0] = 1;
    }
    CHECK(tf::pool_stats().system_allocations == steady.system_allocations);
    CHECK(tf::pool_stats().bytes_in_use == steady.bytes_in_use);

    // With the cache emptied the same size must come from the system again: the counter does move.
    tf::pool_release_cached();
    CHECK(tf::pool_stats().bytes_cached == 0);
    const std::size_t n_before = tf::pool_stats().system_allocations;
    { Tensor fresh = Tensor::zeros(shape); }
    CHECK(tf::pool_stats().system_allocations == n_before + 1);
}

TEST_CASE("Pool: bytes in use follow live tensors", "[tensor]") {
    const tf::PoolStats before = tf::pool_stats();
    std::size_t during = 0;
    {
        Tensor t = Tensor::zeros({1000});
        during = tf::pool_stats().bytes_in_use;
        CHECK(during >= before.bytes_in_use + 1000 * sizeof(real));
        CHECK(tf::pool_stats().peak_bytes_in_use >= during);
        CHECK(tf::pool_stats().bytes_asked == before.bytes_asked + 1000 * sizeof(real));  // exactly the request
        CHECK(tf::pool_stats().peak_bytes_asked >= tf::pool_stats().bytes_asked);
    }
    CHECK(tf::pool_stats().bytes_in_use == before.bytes_in_use);
    CHECK(tf::pool_stats().bytes_asked == before.bytes_asked);
    CHECK(tf::pool_stats().bytes_cached >= 1000 * sizeof(real));
}

// Resident memory of this process, from /proc/self/statm (its second field, in pages).
static double resident_mib() {
    std::ifstream statm("/proc/self/statm");
    long pages = 0, resident = 0;
    statm >> pages >> resident;
    return double(resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

TEST_CASE("Pool: a large buffer given back to the system leaves the process's resident memory", "[tensor]") {
#ifdef __SANITIZE_ADDRESS__
    WARN("not under AddressSanitizer, whose allocator serves every block and keeps freed ones in quarantine");
    return;
#endif
    tf::pool_release_cached();
    double with = 0;
    {
        const Tensor big = Tensor::full({8 << 20}, real(1));  // 32 MiB (64 in the float64 build), every page written
        with = resident_mib();
    }
    tf::pool_release_cached();
    const double without = resident_mib();
    INFO("resident " << with << " MiB with the buffer, " << without << " MiB after");
    CHECK(with - without > 30);
}

TEST_CASE("Pool: once a block of 2 MiB or more went back to the system, later ones start on a 2 MiB boundary", "[tensor]") {
#ifdef __SANITIZE_ADDRESS__
    WARN("not under AddressSanitizer, whose allocator serves every block");
    return;
#endif
    // A 4 MiB buffer, freed and cached; then one of 9 MiB, which the cached one cannot serve and for which the
    // pool's bound (at most 9 MiB above what was in use before) has no room beside it: the 4 MiB block goes
    // back to the system, and the new block is cut on a huge page's boundary.
    tf::pool_release_cached();
    tf::pool_reset_peak();
    { Tensor first = Tensor::zeros({1 << 20}); }
    const std::size_t n_before = tf::pool_stats().system_allocations;
    const Tensor second = Tensor::full({(9 << 20) / std::int64_t(sizeof(real))}, real(3));
    CHECK(tf::pool_stats().system_allocations == n_before + 1);
    CHECK(tf::pool_stats().bytes_cached == 0);
    const auto block = reinterpret_cast<std::uintptr_t>(second.data()) - 64;  // the buffer's header comes first
    CHECK(block % (std::uintptr_t(2) << 20) == 0);
    CHECK(second.data()[0] == real(3));
    CHECK(second.data()[second.numel() - 1] == real(3));
}

TEST_CASE("Pool: a request takes a cached buffer up to twice its size", "[tensor]") {
    tf::pool_release_cached();
    { Tensor big = Tensor::zeros({100000}); }
    const std::size_t n_before = tf::pool_stats().system_allocations;
    for (std::int64_t n = 55000; n <= 100000; n += 5000) {
        Tensor t = Tensor::full({n}, real(2));
        CHECK(t.data()[n - 1] == real(2));
    }
    CHECK(tf::pool_stats().system_allocations == n_before);
    { Tensor small = Tensor::zeros({40000}); }  // under half of the cached buffer: a new one
    CHECK(tf::pool_stats().system_allocations == n_before + 1);
}

// Asks for 60 buffers one at a time, each 5% larger than the last, so that no cached buffer fits and every one
// comes from the system; after each, checks the pool's bound with `base` the bytes in use before (what stays
// in use throughout, so the swing, the peak minus the least in use since, is at most peak - base). Returns the
// last size asked for.
static double ever_new_sizes(std::size_t base) {
    double n = 20000;
    for (int i = 0; i < 60; ++i, n *= 1.05) {
        Tensor t = Tensor::zeros({static_cast<std::int64_t>(n)});
        const tf::PoolStats s = tf::pool_stats();
        INFO("size " << i << ": in use " << s.bytes_in_use << ", cached " << s.bytes_cached << ", peak " << s.peak_bytes_in_use);
        CHECK(s.bytes_cached <= s.peak_bytes_in_use);
        CHECK(s.bytes_in_use + s.bytes_cached <= s.peak_bytes_in_use + (s.peak_bytes_in_use - base) / 7);
    }
    return n / 1.05;
}

TEST_CASE("Pool: buffers of ever new sizes do not pile up: what it holds stays within the peak in use and "
          "a seventh of the swing",
          "[tensor]") {
    tf::pool_release_cached();
    SECTION("nothing else held") {
        // Kept without a bound, the cache would hold the sum of all of them, about 21 times the largest;
        // bounded by the peak alone, the cache and the new buffer together would hold about twice the peak.
        tf::pool_reset_peak();
        const double last = ever_new_sizes(tf::pool_stats().bytes_in_use);
        CHECK(tf::pool_stats().bytes_cached >= static_cast<std::size_t>(last / 2) * sizeof(real));  // it does cache
    }
    SECTION("16 MiB held all along") {
        // A model's weights and Adam's moments stay in use from step to step; only the activations and
        // gradients come and go. A room of a sixteenth of the peak (the bound before) would let about 1 MiB of
        // the sizes pile up in the cache; a seventh of the swing, under 0.2 MiB.
        const Tensor held = Tensor::zeros({4 << 20});
        tf::pool_reset_peak();
        ever_new_sizes(tf::pool_stats().bytes_in_use);
        CHECK(tf::pool_stats().bytes_cached > 0);  // it still caches
    }
}
