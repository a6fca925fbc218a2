// Caching buffer pool: free lists keyed by rounded size. See pool.h.
#include "tapeformer/pool.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

TF_NAMESPACE_BEGIN

namespace {

struct Pool {
    std::mutex mutex;
    std::map<std::size_t, std::vector<real*>> free_lists;  // rounded size -> cached buffers
    PoolStats stats;

    ~Pool() {
        for (auto& [n, list] : free_lists)
            for (real* p : list) std::free(p);
    }
};

Pool& pool() {
    static Pool* p = new Pool;  // never destroyed: tensors in static objects may outlive main
    return *p;
}

// Round n up so that at most 1/8 is wasted: keep the top 4 significant bits.
std::size_t rounded(std::size_t n) {
    if (n <= 64) return 64;
    std::size_t bits = 0;
    for (std::size_t m = n; m >>= 1;) ++bits;
    std::size_t unit = std::size_t(1) << (bits - 3);
    return (n + unit - 1) / unit * unit;
}

}  // namespace

real* pool_alloc(std::size_t n) {
    std::size_t r = rounded(n);
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    real* out = nullptr;
    auto it = p.free_lists.find(r);
    if (it != p.free_lists.end() && !it->second.empty()) {
        out = it->second.back();
        it->second.pop_back();
        p.stats.bytes_cached -= r * sizeof(real);
    } else {
        out = static_cast<real*>(std::aligned_alloc(64, (r * sizeof(real) + 63) / 64 * 64));
        if (!out) throw std::bad_alloc();
        ++p.stats.system_allocations;
    }
    p.stats.bytes_in_use += r * sizeof(real);
    if (p.stats.bytes_in_use > p.stats.peak_bytes_in_use) p.stats.peak_bytes_in_use = p.stats.bytes_in_use;
    return out;
}

void pool_free(real* ptr, std::size_t n) {
    if (!ptr) return;
    std::size_t r = rounded(n);
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.free_lists[r].push_back(ptr);
    p.stats.bytes_in_use -= r * sizeof(real);
    p.stats.bytes_cached += r * sizeof(real);
}

void pool_release_cached() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    for (auto& [n, list] : p.free_lists)
        for (real* ptr : list) std::free(ptr);
    p.free_lists.clear();
    p.stats.bytes_cached = 0;
}

PoolStats pool_stats() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return p.stats;
}

TF_NAMESPACE_END
