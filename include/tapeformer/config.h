// The scalar type of the whole numeric core, and the namespace that keeps two builds of it apart.
//
// The library is compiled twice from the same sources: `real = float` for training and inference, and
// `real = double` (with -DTAPEFORMER_F64) for gradient checks, where float32 central differences are too
// noisy to catch a backward that is wrong by 1e-3 relative. Each build lives in its own inline namespace
// (tf::f32 or tf::f64), so both can be linked into one program: code writes `tf::Tensor` and gets its own.
#pragma once
#include <cstdint>

#ifdef TAPEFORMER_F64
#define TF_NAMESPACE_BEGIN namespace tf { inline namespace f64 {
#else
#define TF_NAMESPACE_BEGIN namespace tf { inline namespace f32 {
#endif
#define TF_NAMESPACE_END } }

TF_NAMESPACE_BEGIN
#ifdef TAPEFORMER_F64
using real = double;
#else
using real = float;
#endif
TF_NAMESPACE_END
