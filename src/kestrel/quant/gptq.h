// GPTQ (Frantar et al. 2022, arXiv 2210.17323): INT4 quantization that rounds a row's weights
// one input channel at a time and spreads each rounding error over the channels not yet
// rounded, through the inverse of the inputs' second-moment matrix H = E[x x^T], so that the
// output error on the calibration inputs, not the weight error, is what is minimized.
#pragma once

#include <cstddef>

#include "kestrel/base/thread_pool.h"
#include "kestrel/quant/w4.h"

namespace kestrel::quant {

/// Quantizes W [rows, cols] to affine INT4 groups of `group_size` (the layout of quantize_w4
/// with zero points) with GPTQ's error compensation. `x`: float32 [n, cols], rows of the
/// matrix's actual inputs, from which H = X^T X / n is formed; `damp` (e.g. 0.01) times the
/// mean of H's diagonal is added to the diagonal. Each group's scale and minimum are fitted
/// (fit_affine_group, weighted by H's diagonal) when the group is reached, to the weights as
/// updated by then. Columns with no input energy are quantized as they are.
/// Throws kestrel::Error for a group size quantize_w4 refuses or n == 0.
W4Matrix quantize_w4_gptq(const float* w, size_t rows, size_t cols, size_t group_size, const float* x, size_t n,
                          double damp, ThreadPool& pool);

}  // namespace kestrel::quant
