// The fuzz targets: one function per loader of untrusted input. Each takes arbitrary bytes and must
// either succeed or throw the error a user would see — a std::runtime_error or std::invalid_argument whose
// message is one line. Anything else (a crash, a sanitizer report, std::bad_alloc, std::out_of_range, a
// JSON library exception leaking out, a message spanning lines) is a bug that the target turns into an
// abort, so that libFuzzer (tests/fuzz/fuzz_main.cpp) records the input.
//
// The same functions run in the ordinary test suite (tests/test_fuzz_regressions.cpp) over every seed
// and every input a fuzzer once crashed on (tests/fuzz/corpus/<target>/, tests/fuzz/regressions/<target>/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tf_fuzz {

using Target = void (*)(const std::uint8_t* data, std::size_t size);

struct NamedTarget {
    const char* name;  // also the folder of its seeds and regressions
    Target run;
};

// safetensors: parse_safetensors, then the model config and training state in its metadata, and the
// weights into a model when the config is small enough to build.
void fuzz_safetensors(const std::uint8_t* data, std::size_t size);
// run.json (train_config_from_json + validate), a checkpoint's training state (train_state_from_json)
// and the checkpoint names state.json lists (checkpoint_step).
void fuzz_run_state(const std::uint8_t* data, std::size_t size);
// The corpus reader: read_lines (UTF-8 check, BOM, CR, trimming) and the word tokenizer on its lines.
void fuzz_text(const std::uint8_t* data, std::size_t size);
// vocab.txt: Vocab::load and a round trip through the word tokenizer.
void fuzz_vocab(const std::uint8_t* data, std::size_t size);
// spm.model: the SentencePiece model loader, then encode/decode with it.
void fuzz_sentencepiece(const std::uint8_t* data, std::size_t size);
// TOML config files (`train --config`): CLI11's ConfigTOML reader.
void fuzz_toml(const std::uint8_t* data, std::size_t size);
// BLEU and chrF input: lines split into hypotheses and references, the 13a tokenizer.
void fuzz_bleu(const std::uint8_t* data, std::size_t size);

const std::vector<NamedTarget>& all_targets();

// Runs `target` on the bytes; returns "" when it behaved (succeeded or threw a one-line user error),
// else what went wrong. fuzz_main aborts on a non-empty answer; the regression test fails on it.
std::string run_checked(Target target, const std::uint8_t* data, std::size_t size);

}  // namespace tf_fuzz
