// Gradient checks of whole model blocks. Filled in with the nn modules.
#include "tapeformer/gradcheck.h"

TF_NAMESPACE_BEGIN

std::vector<GradcheckResult> check_model_blocks(std::uint64_t) { return {}; }

TF_NAMESPACE_END
