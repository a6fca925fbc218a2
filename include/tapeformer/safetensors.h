// The safetensors file format (https://github.com/huggingface/safetensors), used for checkpoints so that
// PyTorch and tapeformer can read each other's weights. A file is
//
//   [8 bytes] N, the header size, unsigned 64-bit little-endian
//   [N bytes] UTF-8 JSON object: {"__metadata__": {"key": "value", ...},          (optional, strings only)
//                                  "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//             padded with trailing spaces so that the data buffer starts at a multiple of 8 bytes
//   [rest]    the data buffer: each tensor's values, row-major, little-endian, at [begin, end) of the
//             buffer; the ranges are contiguous, do not overlap and cover the whole buffer.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/nn/module.h"
#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

// The dtype this build writes: "F32" when real is float, "F64" when real is double.
constexpr const char* kSafetensorsRealDtype = sizeof(real) == 4 ? "F32" : "F64";

// The metadata key under which save_safetensors stores a checksum of the whole file when asked, as
// "crc32c:" followed by eight lowercase hex digits: the CRC-32C (io.h) of every byte of the file (size
// field, header with all metadata, data) with those eight digits read as '0'. load_safetensors verifies
// it; an edit anywhere, metadata included, is refused. (Older tapeformer versions covered the data only:
// such files are refused with a message saying so.) Files tapeformer writes must carry it (checkpoint.h).
constexpr const char* kSafetensorsChecksumKey = "tapeformer.checksum";

// Writes `tensors` to `path` atomically (see write_file_atomic), as kSafetensorsRealDtype.
// Tensors are stored sorted by name, both in the header and in the data buffer (the order the reference
// implementation uses for single-dtype files), so the bytes do not depend on the order of `tensors`.
// A tensor listed under several names (tied weights) is written once per name. With `with_checksum`
// the file's CRC-32C is added to the metadata under kSafetensorsChecksumKey.
// Throws std::invalid_argument for an undefined tensor, a repeated name or the reserved name
// "__metadata__"; std::runtime_error when the file cannot be written.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {}, bool with_checksum = false);
// The bytes save_safetensors writes, without writing them.
std::string serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata = {},
                                  bool with_checksum = false);

// One tensor read from a file.
struct SafetensorsEntry {
    std::string dtype;                // as stored: "F32", "F64", "F16", "BF16", "I64", "I32", ...
    std::vector<std::int64_t> shape;  // any rank; {} is a scalar
    std::vector<real> values;         // numel() values, converted to real
    std::int64_t numel() const;
};

// What load_safetensors returns: everything in the file, decoded.
struct SafetensorsFile {
    std::string path;                                 // for error messages
    std::map<std::string, std::string> metadata;      // "__metadata__", empty when absent
    std::map<std::string, SafetensorsEntry> tensors;  // by name

    // The named tensor as a Tensor (rank at most 4). Throws std::runtime_error when absent.
    Tensor tensor(const std::string& name) const;
};

// Reads and validates a whole safetensors file. Every problem (too short, header size past the end of
// the file, invalid JSON, unknown dtype, shape that does not match the byte range, ranges outside the
// buffer, overlapping or leaving gaps, trailing bytes, non-string metadata, checksum mismatch) throws
// std::runtime_error with one line "<path>: <what is wrong>"; nothing is read out of bounds.
// Readable dtypes: F64, F32, F16, BF16 and the integer types (I8..I64, U8..U64, BOOL), converted to
// real (integers beyond 2^24 lose precision in the float32 build). A file that holds an F8 tensor
// is rejected.
SafetensorsFile load_safetensors(const std::string& path);
// The same for bytes already in memory; `name` stands for the file in error messages.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name);

// Copies the file's tensors into `params` (through the handles: the model's tensors change).
// Checks everything before copying anything, and throws std::runtime_error naming the first problem:
// a parameter absent from the file ("missing tensor X"), a file tensor that is no parameter
// ("unexpected tensor X"), a shape mismatch ("shape of X is (a, b) in the file, (c, d) in the model"),
// an integer dtype, or tied parameters (one tensor under two names) with different values in the file.
// With strict = false, missing and unexpected tensors are skipped instead (shapes must still match).
void load_into(const ParamList& params, const SafetensorsFile& file, bool strict = true);

TF_NAMESPACE_END
