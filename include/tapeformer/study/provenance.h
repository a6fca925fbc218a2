// What a study's output was computed from — the model file and its checksum, the data, the masked heads —
// written into its JSON ("made_from"), so that a result read months later still says what it describes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

struct ModelBundle;  // run/checkpoint.h

struct StudyProvenance {
    std::string model;                      // --model as given
    std::string weights;                    // the file the weights were read from
    std::string weights_crc32c;             // "crc32c:xxxxxxxx" of that file's bytes, read again now
    std::int64_t step = -1;                 // the training step of those weights (−1: not one step)
    std::vector<std::string> data;          // the data files read, or the sentence given on the command line
    std::int64_t pairs_read = 0, pairs_used = 0;  // line pairs in the files; of them, studied
    std::vector<std::string> masked_heads;  // heads whose gate was 0 (--mask-heads), "E:0:1"
};

// The model's part of the record, from a loaded bundle (its gates as they are now: call after --mask-heads).
StudyProvenance study_provenance(ModelBundle& bundle, const std::string& model_arg);

TF_NAMESPACE_END
