// The reference solution of docs/exercises/sinusoidal_positions.cpp, which the grader's tests compile and
// check (tests/test_exercises.cpp).
#include <cmath>

extern "C" void sinusoidal_positions(double* pe, long positions, long C) {
    for (long pos = 0; pos < positions; ++pos)
        for (long i = 0; i < C; i += 2) {
            const double angle = double(pos) / std::pow(10000.0, double(i) / double(C));
            pe[pos * C + i] = std::sin(angle);
            if (i + 1 < C) pe[pos * C + i + 1] = std::cos(angle);
        }
}
