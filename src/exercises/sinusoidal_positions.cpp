// Exercise sinusoidal_positions: the positional encoding table of "Attention Is All You Need", §3.5.
//   PE[pos, 2i] = sin(pos / 10000^(2i/C)),   PE[pos, 2i+1] = cos(pos / 10000^(2i/C))
// Checked against the library's table (src/nn/embedding.cpp, PositionalEncoding).
#include "tapeformer/nn/embedding.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

using SinusoidalPositions = void (*)(double* pe, long positions, long C);

std::string grade(SinusoidalPositions student, long positions, long C) {
    const std::vector<double> expected = PositionalEncoding(PositionalKind::Sinusoidal, positions, C).table.to_vector();
    std::vector<double> pe = unwritten(expected.size());
    student(pe.data(), positions, C);
    return compare("PE", expected, pe, C, 1e-9, 1e-9);
}

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<SinusoidalPositions>(fn);
    return {
        {"8 positions, C = 16", [=] { return grade(student, 8, 16); }},
        {"one position, C = 2: PE[0] = (sin 0, cos 0) = (0, 1)", [=] { return grade(student, 1, 2); }},
        {"odd C = 5: the last column is a sine with no cosine after it", [=] { return grade(student, 6, 5); }},
        {"2048 positions, C = 64: long sequences, small frequencies", [=] { return grade(student, 2048, 64); }},
    };
}

}  // namespace

GradedExercise sinusoidal_positions_exercise() {
    return {"sinusoidal_positions", "the sinusoidal positional encoding table PE (positions, C)",
            "extern \"C\" void sinusoidal_positions(double* pe, long positions, long C);", cases};
}

TF_NAMESPACE_END
