// StudyProvenance as the "made_from" object of the studies' JSON files (private to src/study).
#pragma once
#include <nlohmann/json.hpp>

#include "tapeformer/study/provenance.h"

TF_NAMESPACE_BEGIN

nlohmann::json provenance_json(const StudyProvenance& p);

TF_NAMESPACE_END
