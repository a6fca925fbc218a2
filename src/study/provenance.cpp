// What a study's output was computed from (provenance.h).
#include "tapeformer/study/provenance.h"

#include "provenance_json.h"

#include "tapeformer/io.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/study/head_ids.h"

TF_NAMESPACE_BEGIN

StudyProvenance study_provenance(ModelBundle& bundle, const std::string& model_arg) {
    StudyProvenance p;
    p.model = model_arg;
    p.weights = bundle.weights_path;
    p.weights_crc32c = checksum_str(crc32c(read_file(bundle.weights_path)));
    p.step = bundle.stamp.step;
    for (const HeadId& h : masked_heads(*bundle.model)) p.masked_heads.push_back(h.str());
    return p;
}

nlohmann::json provenance_json(const StudyProvenance& p) {
    return {{"model", p.model},
            {"weights", p.weights},
            {"weights_checksum", p.weights_crc32c},
            {"step", p.step},
            {"data", p.data},
            {"pairs_read", p.pairs_read},
            {"pairs_used", p.pairs_used},
            {"masked_heads", p.masked_heads}};
}

TF_NAMESPACE_END
