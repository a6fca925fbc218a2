// The libFuzzer entry point of one target (TF_FUZZ_TARGET names it; see targets.h): anything but success
// or a one-line user error aborts, and libFuzzer keeps the input as crash-<hash>.
#include <cstdio>
#include <cstdlib>

#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string problem = tf_fuzz::run_checked(tf_fuzz::TF_FUZZ_TARGET, data, size);
    if (!problem.empty()) {
        std::fprintf(stderr, "tapeformer fuzz: %s\n", problem.c_str());
        std::abort();
    }
    return 0;
}
