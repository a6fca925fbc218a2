// Caching buffer pool: cached buffers by capacity and by age; what it holds, in use and cached, bounded by the
// peak in use and a seventh of the swing below it. See pool.h.
#include "tapeformer/pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include <sys/mman.h>
#include <unistd.h>

TF_NAMESPACE_BEGIN

namespace {

// Every buffer starts 64 bytes after the block the system gave; the block's head records the buffer's
// capacity (a buffer handed out for a smaller request goes back under its real size) and when it was
// last freed (the cache gives up its least recently freed buffers first).
constexpr std::size_t kHeader = 64;
struct Header {
    std::size_t capacity;  // values
    std::size_t asked;     // values asked for by the request it serves now
    std::uint64_t freed_at;
};
Header& header_of(real* buffer) { return *reinterpret_cast<Header*>(reinterpret_cast<char*>(buffer) - kHeader); }
std::size_t block_bytes(std::size_t capacity) {  // a multiple of 64, as aligned_alloc wants
    return (kHeader + capacity * sizeof(real) + 63) / 64 * 64;
}

// Blocks of at least 1 MiB are mapped and unmapped here rather than taken from malloc: glibc serves a
// block from its heap instead once the mmap threshold has risen past the block's size (it rises to the
// size of each mapped block freed, up to 32 MiB), and memory freed inside the heap stays in the process
// (bench/README.md: the large benchmark model's peak RSS). Under AddressSanitizer every block comes from
// malloc, which it checks.
#ifdef __SANITIZE_ADDRESS__
constexpr std::size_t kMappedBlock = std::numeric_limits<std::size_t>::max();
#else
constexpr std::size_t kMappedBlock = std::size_t(1) << 20;
#endif

// Huge pages for the blocks that come and go. Once the pool has given a block of 2 MiB or more back to the
// system (Pool::churns: the sizes a step asks for are ones its cache cannot match, as the benchmark step's
// 40 MB logits), later blocks of 2 MiB or more start on a 2 MiB boundary and ask for transparent huge pages
// (granted where the kernel offers them "always" or on "madvise": see docs/usage.md). Every first touch of a
// 4 KiB page of a fresh mapping is a fault: in a virtual machine some 3.4 µs each, 35 ms for 40 MB, against
// 4 ms in 2 MiB pages (bench/README.md). Not from the start: the weights, Adam's moments and the first step
// are touched once, and there fresh 2 MiB pages cost more than 4 KiB ones (the large benchmark model took
// 2 s longer to start). The kernel aligns only mappings whose length is a multiple of 2 MiB, so the block is
// cut out of a mapping 2 MiB longer, the rest unmapped at once.
constexpr std::size_t kHugePage = std::size_t(2) << 20;

char* map_block(std::size_t bytes, bool huge) {
    if (!huge || bytes < kHugePage) {
        void* block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return block == MAP_FAILED ? nullptr : static_cast<char*>(block);
    }
    void* area = mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return nullptr;
    char* const start = static_cast<char*>(area);
    char* const block = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(start) + kHugePage - 1) / kHugePage * kHugePage);
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    char* const end = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(block + bytes) + page - 1) / page * page);
    if (block > start) munmap(start, std::size_t(block - start));
    if (end < start + bytes + kHugePage) munmap(end, std::size_t(start + bytes + kHugePage - end));
    madvise(block, bytes, MADV_HUGEPAGE);  // only advice: without huge pages the block is the same, in 4 KiB pages
    return block;
}

char* system_alloc(std::size_t bytes, bool huge) {
    if (bytes < kMappedBlock) return static_cast<char*>(std::aligned_alloc(64, bytes));
    return map_block(bytes, huge);
}
void system_free(real* buffer) {
    char* block = reinterpret_cast<char*>(buffer) - kHeader;
    const std::size_t bytes = block_bytes(header_of(buffer).capacity);
    if (bytes < kMappedBlock) std::free(block);
    else munmap(block, bytes);
}

struct Pool {
    using BySize = std::multimap<std::size_t, real*>;
    std::mutex mutex;
    BySize by_size;                                  // capacity -> cached buffer
    std::map<std::uint64_t, BySize::iterator> by_age; // freed_at -> its entry in by_size, oldest first
    std::uint64_t clock = 0;
    bool poison = false;
    PoolStats stats;
    std::size_t low_since_peak = 0;  // the least in use since the peak was last raised (or reset)
    bool churns = false;             // a block of 2 MiB or more went back to the system: later ones get huge pages

    void uncache(BySize::iterator it) {
        stats.bytes_cached -= it->first * sizeof(real);
        by_age.erase(header_of(it->second).freed_at);
        by_size.erase(it);
    }
    // Before asking the system for `bytes` more: gives the least recently freed buffers back until what the
    // pool holds, in use and cached, fits within the peak in use and a seventh of the swing below it (or the
    // new peak, if this request makes one). The swing, the peak minus the least in use since, is what a
    // training step allocates and frees (its activations and gradients); the weights and Adam's moments, held
    // all along, need no room to spare. With no room at all, a training step gave back and asked again for 68
    // buffers every step, 6% of its time; with an eighth, none, until post-norm training let the norms' values
    // go and the peak fell below the gradients and cached activations at backward's end: an eighth then gave
    // the logits' buffer back every step, a seventh none (the benchmark's models; bench/README.md). Since
    // training lets more values go (the peak fell again), the benchmark's step gives back its logits' 40 MB
    // and two smaller blocks every step with a seventh too; the huge pages above (map_block) keep that cheap
    // where more room would cost resident memory.
    void make_room(std::size_t bytes) {
        const std::size_t peak = stats.peak_bytes_in_use;
        const std::size_t bound = std::max(peak + (peak - low_since_peak) / 7, stats.bytes_in_use + bytes);
        while (!by_age.empty() && stats.bytes_in_use + stats.bytes_cached + bytes > bound) give_back_oldest();
    }
    // Gives the least recently freed buffers back until the cache is within the peak in use.
    void trim() {
        while (stats.bytes_cached > stats.peak_bytes_in_use) give_back_oldest();
    }
    void give_back_oldest() {  // the least recently freed cached buffer, to the system
        const auto oldest = by_age.begin()->second;
        real* victim = oldest->second;
        uncache(oldest);
        if (block_bytes(header_of(victim).capacity) >= kHugePage) churns = true;
        system_free(victim);
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

// The smallest cached buffer that holds n values, if it is at most twice the rounded size: batches of
// varying shapes (bucketed sentences) share buffers instead of each size keeping its own.
real* pool_alloc(std::size_t n) {
    static_assert(sizeof(Header) <= kHeader, "the header must fit before the 64-byte aligned buffer");
    const std::size_t r = rounded(n);
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    real* out = nullptr;
    auto it = p.by_size.lower_bound(r);
    if (it != p.by_size.end() && it->first <= 2 * r) {
        out = it->second;
        p.uncache(it);
    } else {
        p.make_room(r * sizeof(real));
        char* block = system_alloc(block_bytes(r), p.churns);
        if (!block) throw std::bad_alloc();
        out = reinterpret_cast<real*>(block + kHeader);
        header_of(out).capacity = r;
        ++p.stats.system_allocations;
    }
    p.stats.bytes_in_use += header_of(out).capacity * sizeof(real);
    if (p.stats.bytes_in_use > p.stats.peak_bytes_in_use) p.stats.peak_bytes_in_use = p.low_since_peak = p.stats.bytes_in_use;
    header_of(out).asked = n;
    p.stats.bytes_asked += n * sizeof(real);
    p.stats.peak_bytes_asked = std::max(p.stats.peak_bytes_asked, p.stats.bytes_asked);
    if (p.poison) std::fill(out, out + header_of(out).capacity, std::numeric_limits<real>::quiet_NaN());
    return out;
}

// The cache holds at most the peak in use (what one step needs): beyond it, the least recently freed
// buffers go back to the system (large blocks are unmapped, so the memory really is returned). A request
// the cache cannot serve first makes room (Pool::make_room).
void pool_free(real* ptr) {
    if (!ptr) return;
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    Header& h = header_of(ptr);
    p.stats.bytes_in_use -= h.capacity * sizeof(real);
    p.stats.bytes_asked -= h.asked * sizeof(real);
    p.low_since_peak = std::min(p.low_since_peak, p.stats.bytes_in_use);
    h.freed_at = ++p.clock;
    p.by_age.emplace(h.freed_at, p.by_size.emplace(h.capacity, ptr));
    p.stats.bytes_cached += h.capacity * sizeof(real);
    p.trim();
}

void pool_release_cached() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    for (auto& [capacity, ptr] : p.by_size) system_free(ptr);
    p.by_size.clear();
    p.by_age.clear();
    p.stats.bytes_cached = 0;
}

void pool_reset_peak() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.stats.peak_bytes_in_use = p.low_since_peak = p.stats.bytes_in_use;
    p.stats.peak_bytes_asked = p.stats.bytes_asked;
    p.trim();
}

void pool_poison(bool on) {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.poison = on;
}

PoolStats pool_stats() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return p.stats;
}

TF_NAMESPACE_END
