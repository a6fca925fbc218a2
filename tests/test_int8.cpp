// --precision int8 (blas.h's INT8): the products over held weights quantised to int8 with int32 sums. The
// quantisation against hand-computed values; the oneDNN product against reference::gemm_int8, its plain
// form; every other product left in fp32, bit for bit; a greedy decoding under int8 against the one that
// runs the reference kernel (reference mode); and, on a trained copy-task model, int8 translations
// against fp32 ones. Cases that need int8 instructions (AVX512-VNNI or AMX) are skipped, with a message,
// on a CPU without them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/decode.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/random.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/run/train.h"
#include "helpers.h"
#include "training.h"

using tf::Precision;
using tf_test::PrecisionScope;
using tf_test::uniform;

namespace {

bool skip_without_int8() {
    if (tf::cpu_has_int8()) return false;
    tf_test::skipped("this CPU has no int8 instructions (AVX512-VNNI or AMX)");
    return true;
}

// A product C (M, N) = α·A (M, K)·Bᵀ + β·C over a held B (N, K), as decoding's linear layers run them.
struct Use {
    const char* what;
    std::int64_t M, N, K;
    float alpha, beta;
};

}  // namespace

TEST_CASE("int8: parse, name, and the setting", "[int8]") {
    CHECK(tf::parse_precision("int8") == Precision::INT8);
    CHECK(std::string(tf::precision_name(Precision::INT8)) == "int8");
    CHECK_THROWS_WITH(tf::parse_precision("int4"), Catch::Contains("fp32, bf16, int8") && Catch::Contains("int4"));
    {
        PrecisionScope scope(Precision::INT8);
        CHECK(tf::precision() == (tf::cpu_has_int8() ? Precision::INT8 : Precision::FP32));
    }
    CHECK(tf::precision() == Precision::FP32);
}

TEST_CASE("int8: rows quantised with one scale each, to nearest even", "[int8]") {
    // Row 0: max 2, so x·127/2: 1 -> 63.5 -> 64 (even), -2 -> -127, 0.5 -> 31.75 -> 32, 0.25 -> 15.875 -> 16.
    // Row 1: zeros -> scale 0. Row 2: max 127 -> the values themselves, 2.5 -> 2 (even), -0.5 -> -0 (even).
    const std::vector<float> x = {1, -2, 0.5f, 0.25f, /* padding */ 9, 0, 0, 0, 0, 9, 127, 2.5f, -0.5f, -127, 9};
    std::vector<std::int8_t> q(12);
    std::vector<float> s(3);
    tf::int8_quantize_rows(x.data(), 3, 4, 5, q.data(), s.data());
    CHECK(q == std::vector<std::int8_t>{64, -127, 32, 16, 0, 0, 0, 0, 127, 2, 0, -127});
    CHECK(s[0] == 2.0f / 127.0f);
    CHECK(s[1] == 0.0f);
    CHECK(s[2] == 1.0f);
}

TEST_CASE("int8: a held product equals reference::gemm_int8 up to the rescale's rounding", "[int8][frozen]") {
    if (skip_without_int8()) return;
    constexpr std::int64_t C = 256;
    const std::vector<float> square = uniform(C * C, 70), ffn_out = uniform(4 * C * C, 72), wide = uniform(2000 * C, 73);
    const std::vector<Use> uses = {{"square, 64 rows", 64, C, C, 1, 1},   {"square, 1 row", 1, C, C, 1, 0},
                                   {"ffn out, 32 rows", 32, C, 4 * C, 1, 1}, {"output projection, 19 rows, alpha 0.5", 19, 2000, C, 0.5f, 0},
                                   {"square, 5 rows, beta 0.5", 5, C, C, 1, 0.5f}};
    PrecisionScope scope(Precision::INT8);
    tf::FrozenMatrices frozen;
    frozen.add(square.data(), C, C);
    frozen.add(ffn_out.data(), C, 4 * C);
    frozen.add(wide.data(), 2000, C);
    std::uint64_t seed = 300;
    for (const Use& u : uses) {
        INFO(u.what);
        const float* B = u.N == 2000 ? wide.data() : u.K == 4 * C ? ffn_out.data() : square.data();
        const std::int64_t lda = u.K + 3, ldc = u.N + 2;
        const std::vector<float> A = uniform(std::size_t(u.M * lda), seed += 2), C0 = uniform(std::size_t(u.M * ldc), seed + 1);
        std::vector<float> fast = C0, ref = C0, fp32 = C0;
        tf::gemm(false, true, u.M, u.N, u.K, u.alpha, A.data(), lda, B, u.K, u.beta, fast.data(), ldc);
        tf::reference::gemm_int8(u.M, u.N, u.K, u.alpha, A.data(), lda, B, u.K, u.beta, ref.data(), ldc);
        tf::reference::gemm(false, true, u.M, u.N, u.K, u.alpha, A.data(), lda, B, u.K, u.beta, fp32.data(), ldc);
        // Both quantise to the same integers and sum them exactly in int32; what may differ is the last
        // step, c + α·r, which the compiler may fuse into one multiply-add in one loop and not the other:
        // one rounding, at most an ulp of the larger term.
        double worst = 0, worst_fp32 = 0;
        std::int64_t differ = 0;
        for (std::int64_t i = 0; i < u.M; ++i)
            for (std::int64_t j = 0; j < u.N; ++j) {
                const std::int64_t at = i * ldc + j;
                const double scale = std::fabs(double(ref[at])) + std::fabs(double(u.beta) * C0[at]) + 1e-30;
                worst = std::max(worst, std::fabs(double(fast[at]) - ref[at]) / scale);
                differ += fast[at] != ref[at];
                // and int8 is close to the fp32 product: each operand within half a step (max/254) of its value
                worst_fp32 = std::max(worst_fp32, std::fabs(double(fast[at]) - fp32[at]) / std::sqrt(double(u.K)));
            }
        INFO("elements that differ in any bit: " << differ << " of " << u.M * u.N);
        CHECK(worst <= 2.4e-7);  // 2^-22: one rounding of a float
        CHECK(worst_fp32 <= 0.02);
        for (std::int64_t i = 0; i < u.M; ++i)  // the padding between rows of C is untouched
            for (std::int64_t j = u.N; j < ldc; ++j) CHECK(fast[i * ldc + j] == C0[i * ldc + j]);
    }
}

TEST_CASE("int8: products over weights not held stay fp32, bit for bit, and reference mode runs gemm_int8", "[int8][frozen]") {
    if (skip_without_int8()) return;
    constexpr std::int64_t C = 256;
    const std::vector<float> held = uniform(C * C, 80), other = uniform(C * C, 81);
    const std::vector<float> A = uniform(std::size_t(C * C), 82), C0 = uniform(std::size_t(C * C), 83);
    auto product = [&](const float* B) {
        std::vector<float> out = C0;
        tf::gemm(false, true, C, C, C, 1, A.data(), C, B, C, 1, out.data(), C);
        return out;
    };
    const std::vector<float> fp32 = product(other.data());
    PrecisionScope scope(Precision::INT8);
    tf::FrozenMatrices frozen;
    frozen.add(held.data(), C, C);
    CHECK(product(other.data()) == fp32);  // attention's QKᵀ and AV are such products
    std::vector<float> ref = C0;
    tf::reference::gemm_int8(C, C, C, 1, A.data(), C, held.data(), C, 1, ref.data(), C);
    tf::ReferenceModeScope reference;
    CHECK(product(held.data()) == ref);
}

TEST_CASE("int8: a greedy decoding equals the one computed with the reference int8 kernel", "[int8][decode]") {
    if (skip_without_int8()) return;
    tf_test::DecodingCase d = tf_test::sharpened_decoding_case();  // test_frozen's model and sentences
    tf::Transformer& model = *d.model;
    const std::vector<std::int32_t>& src = d.src;
    const std::int64_t B = d.B, S = d.S;
    tf::DecodeOptions o;
    o.beam = 1;
    PrecisionScope scope(Precision::INT8);
    const tf::FrozenWeights frozen(model);
    const auto fast = tf::translate_batch_scored(model, src, B, S, o);
    std::vector<tf::Translation> plain;
    {
        // Every product plainly, the held ones through reference::gemm_int8; softmax, layer norm and the
        // rest in their reference forms too, so the activations differ from the fast ones in their last
        // bits, and a value on a rounding boundary can quantise to its neighbour. Where that changes one
        // greedy choice the rest of that sentence follows it; which sentences it hits depends on the fp32
        // kernels before the quantisation (all 80 sentences agree under OpenBLAS's Haswell, Zen and
        // Sandybridge kernels; under SkylakeX's, Zen 5, two differ in a word and one, with the same words,
        // in its log-probability by 0.14%). The products themselves are compared bit for bit above; here at
        // least 95% of the sentences must have the same words and log-probabilities within 1e-3.
        tf::ReferenceModeScope reference;
        plain = tf::translate_batch_scored(model, src, B, S, o);
    }
    PrecisionScope fp32_scope(Precision::FP32);
    const auto fp32 = tf::translate_batch_scored(model, src, B, S, o);
    REQUIRE(fast.size() == std::size_t(B));
    REQUIRE(plain.size() == std::size_t(B));
    std::int64_t same_as_fp32 = 0, same_as_plain = 0;
    for (std::int64_t b = 0; b < B; ++b) {
        INFO("sentence " << b);
        same_as_plain += fast[b].tokens == plain[b].tokens && fast[b].log_prob == Approx(plain[b].log_prob).epsilon(1e-3);
        same_as_fp32 += fast[b].tokens == fp32[b].tokens;
    }
    INFO("sentences the same as the plain int8 decoding's (words, log-probability): " << same_as_plain << " of " << B);
    CHECK(same_as_plain * 100 >= B * 95);
    // int8 is not fp32: on these random weights, whose outputs run to 24 tokens of near-repeats where one
    // changed token changes the rest, 64 of the 80 sentences came out the same (Zen 5); a trained model
    // agrees far more (the copy-task case below).
    INFO("sentences the same as fp32's: " << same_as_fp32 << " of " << B);
    CHECK(same_as_fp32 >= B * 7 / 10);
}

TEST_CASE("int8: on a trained copy-task model, int8 translations match fp32's", "[int8][learns][train]") {
    if (skip_without_int8()) return;
    tf_test::TempDir tmp;
    auto task = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::copy);
    task.valid = task.test = 500;
    tf::write_sequence_task(tmp / "copy", task);
    const tf::TrainConfig c = tf_test::copy_task_config(tmp / "copy", tmp / "run", 600);  // exact from 300 steps
    std::ostringstream log;
    const int threads = tf::num_threads();
    tf::train(c, log, false);
    tf::set_threads(threads);

    const tf::ModelBundle bundle = tf::load_model_dir(tmp / "run");
    const auto src = tf_test::split_lines(tf_test::read_all(tmp / "copy/test.src"));
    const auto fp32 = tf::translate_lines(*bundle.model, bundle.tokenizers, src, tf::DecodeOptions{});
    std::vector<std::string> int8;
    {
        PrecisionScope scope(Precision::INT8);
        int8 = tf::translate_lines(*bundle.model, bundle.tokenizers, src, tf::DecodeOptions{});
    }
    REQUIRE(int8.size() == src.size());
    int exact_fp32 = 0, exact_int8 = 0, agree = 0;
    for (std::size_t i = 0; i < src.size(); ++i) {
        exact_fp32 += fp32[i] == src[i];
        exact_int8 += int8[i] == src[i];
        agree += int8[i] == fp32[i];
    }
    const double bleu_fp32 = tf::corpus_bleu(fp32, src).score, bleu_int8 = tf::corpus_bleu(int8, src).score;
    INFO("exact: fp32 " << exact_fp32 << ", int8 " << exact_int8 << " of 500; agree " << agree << "; BLEU fp32 "
                        << bleu_fp32 << ", int8 " << bleu_int8);
    CHECK(agree >= 490);
    CHECK(std::fabs(bleu_fp32 - bleu_int8) <= 1.0);
}

TEST_CASE("int8 on the command line: bench train --eval-greedy and --eval-beam, the fallback, and train refusing it", "[int8][cli]") {
    tf_test::TempDir tmp;
    const std::string small = " bench train --d-model 32 --heads 2 --ffn 64 --layers 1 --vocab 100 --batch 4 --tgt-len 6"
                              " --src-len 6 --bench-warmup 0 --eval-reps 1";
    auto run = [&](const std::string& env, const std::string& args) {
        const std::string out = tmp / "out", err = tmp / "err";
        const int status = std::system((env + " " + tf_test::shell_quote(TF_CLI) + " --threads 1" + args + " >" +
                                        tf_test::shell_quote(out) + " 2>" + tf_test::shell_quote(err))
                                           .c_str());
        return std::make_tuple(status, tf_test::read_all(out), tf_test::read_all(err));
    };
    {   // int8 times decoding: without --eval-greedy there is nothing for it to do
        const auto [status, out, err] = run("", small + " --steps 1 --precision int8");
        CHECK(status != 0);
        CHECK(err.find("--eval-greedy") != std::string::npos);
        CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    }
    {   // train refuses it, in one line
        const auto [status, out, err] = run("", " train --train-src x --train-tgt y --precision int8");
        INFO(err);
        CHECK(status != 0);
        CHECK(err.find("int8") != std::string::npos);
        CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    }
    {   // oneDNN told to use no more than AVX-512 without VNNI: the note, then an fp32 run
        const auto [status, out, err] = run("ONEDNN_MAX_CPU_ISA=AVX512_CORE", small + " --steps 0 --eval-greedy --precision int8");
        INFO(out << err);
        CHECK(status == 0);
        CHECK(out.find("precision int8: this CPU has no int8 instructions") != std::string::npos);
        CHECK(out.find("\"precision\":\"fp32\"") != std::string::npos);
    }
    {   // --eval-beam times beam search beside greedy, and only beside it
        const auto [status, out, err] = run("", small + " --steps 0 --eval-beam 2");
        CHECK(status != 0);
        CHECK(err.find("--eval-greedy") != std::string::npos);
    }
    if (skip_without_int8()) return;
    const auto [status, out, err] = run("", small + " --steps 0 --eval-greedy --eval-beam 2 --precision int8");
    INFO(out << err);
    CHECK(status == 0);
    CHECK(out.find("\"precision\":\"int8\"") != std::string::npos);
    CHECK(out.find("greedy_tokens_per_s") != std::string::npos);
    CHECK(out.find("\"beam\":2") != std::string::npos);
    CHECK(out.find("beam_tokens_per_s") != std::string::npos);
}
