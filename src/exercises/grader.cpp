// The grader (exercises.h): the catalogue, loading the student's compiled function, running its cases, and
// the comparisons every exercise shares (grader.h).
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "grader.h"  // first: it opens the float64 namespace as config.h does (inline), before exercises.h names it
#include "tapeformer/exercises.h"

TF_NAMESPACE_BEGIN

// docs/exercises/<name>.cpp as text; defined in the file CMake generates from them (exercise_stubs.cpp).
const char* exercise_stub_text(const std::string& name);

namespace {

const std::vector<GradedExercise>& graded() {
    static const std::vector<GradedExercise> all = {softmax_backward_exercise(), layer_norm_backward_exercise(),
                                                    sinusoidal_positions_exercise(), attention_exercise(),
                                                    label_smoothed_cross_entropy_exercise(),
                                                    adam_step_exercise(), greedy_decode_exercise()};
    return all;
}

const GradedExercise& graded(const std::string& name) {
    for (const GradedExercise& e : graded())
        if (name == e.name) return e;
    find_exercise(name);  // throws, listing the names
    throw std::logic_error("unreachable");
}

std::string index_str(std::size_t i, std::int64_t cols) {
    if (cols <= 1) return "[" + std::to_string(i) + "]";
    return "[" + std::to_string(std::int64_t(i) / cols) + ", " + std::to_string(std::int64_t(i) % cols) + "]";
}

std::string number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

}  // namespace

const std::vector<ExerciseInfo>& exercises() {
    static const std::vector<ExerciseInfo> all = [] {
        std::vector<ExerciseInfo> out;
        for (const GradedExercise& e : graded()) out.push_back({e.name, e.title, e.signature});
        return out;
    }();
    return all;
}

const ExerciseInfo& find_exercise(const std::string& name) {
    std::string names;
    for (const ExerciseInfo& e : exercises()) {
        if (e.name == name) return e;
        names += (names.empty() ? "" : ", ") + e.name;
    }
    throw std::invalid_argument("no exercise '" + name + "'; the exercises are " + names);
}

std::string exercise_stub(const std::string& name) { return exercise_stub_text(find_exercise(name).name); }

int check_exercise(const std::string& name, const std::string& shared_object, std::ostream& out) {
    const GradedExercise& exercise = graded(name);
    void* handle = dlopen(shared_object.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw std::runtime_error(std::string("cannot load the compiled exercise: ") + dlerror());
    void* fn = dlsym(handle, exercise.name);
    if (!fn)
        throw std::runtime_error(std::string("the file defines no function ") + exercise.name + "; the grader looks for\n  " +
                                 exercise.signature + "\n(declared extern \"C\", as in the stub)");
    const std::vector<GradedCase> cases = exercise.cases(fn);
    int failed = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        out << "[" << i + 1 << "/" << cases.size() << "] " << cases[i].name << " ... " << std::flush;
        const std::string wrong = cases[i].run();
        if (wrong.empty()) {
            out << "ok\n";
            continue;
        }
        ++failed;
        out << "FAIL\n";
        std::size_t start = 0;
        while (start < wrong.size()) {  // the explanation, indented under its case
            const std::size_t end = wrong.find('\n', start);
            out << "      " << wrong.substr(start, end == std::string::npos ? std::string::npos : end - start) << "\n";
            start = end == std::string::npos ? wrong.size() : end + 1;
        }
    }
    out << exercise.name << ": " << cases.size() - failed << " of " << cases.size() << " cases passed\n" << std::flush;
    dlclose(handle);
    return failed;
}

std::string compare(const std::string& what, const std::vector<double>& expected, const std::vector<double>& got,
                    std::int64_t cols, double rtol, double atol) {
    std::size_t wrong = 0, first = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
        const bool ok = std::abs(got[i] - expected[i]) <= atol + rtol * std::abs(expected[i]);  // false for NaN
        if (!ok && wrong++ == 0) first = i;
    }
    if (wrong == 0) return "";
    std::string s = what + index_str(first, cols) + ": expected " + number(expected[first]) + ", got " + number(got[first]);
    if (std::isnan(got[first])) s += " (never written?)";
    return s + "\n" + std::to_string(wrong) + " of " + std::to_string(expected.size()) + " elements of " + what +
           " are wrong (tolerance " + number(atol) + " + " + number(rtol) + " * |expected|)";
}

std::vector<double> uniform_values(Rng& rng, std::size_t n, double lo, double hi) {
    std::vector<double> v(n);
    for (double& x : v) x = lo + (hi - lo) * rng.uniform();
    return v;
}

std::vector<double> central_differences(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
                                        double h) {
    std::vector<double> d(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i];
        x[i] = keep + h;
        const double up = f(x);
        x[i] = keep - h;
        const double down = f(x);
        x[i] = keep;
        d[i] = (up - down) / (2 * h);
    }
    return d;
}

std::vector<double> unwritten(std::size_t n) { return std::vector<double>(n, std::nan("")); }

TF_NAMESPACE_END
