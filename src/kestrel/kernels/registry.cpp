#include "kestrel/kernels/registry.h"

#include <array>
#include <cctype>

#include "hwy/targets.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/gemv_w4_bf16.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/gemv_w4_interleaved.h"
#include "kestrel/kernels/gemv_w4_rows.h"
#include "kestrel/kernels/int8_isa.h"

namespace kestrel::kernels {
namespace {

using L = WeightLayout;
using P = Phase;
using N = Need;
using K = Kernel;

// The table. Read top to bottom: the first rule whose layout and phase match and whose need holds
// names the kernel. The last rule of each layout needs nothing, so every product finds one.
// Where a layout has one kernel for both phases its products are batch-invariant
// (kernel_batch_invariant): a token's bits do not depend on how many tokens share the call.
constexpr KernelRule kRules[] = {
    // float32, fp16, bf16 rows (a GGUF's source form, the BF16/FP16 baseline images)
    {L::kF32Rows, P::kAny, N::kNothing, K::kF32Tiles},
    {L::kBF16Rows, P::kPrefill, N::kBf16Dot, K::kBf16Tiles},
    {L::kBF16Rows, P::kPrefill, N::kNothing, K::kHalfTilesF32},
    {L::kBF16Rows, P::kDecode, N::kNothing, K::kHalfRows},
    {L::kF16Rows, P::kPrefill, N::kNothing, K::kHalfTilesF32},
    {L::kF16Rows, P::kDecode, N::kNothing, K::kHalfRows},
    // Q8_0 rows: layers a --tensor-type kept at Q8_0, a GGUF's Q8_0/Q6_K tensors, output heads
    {L::kQ8_0Rows, P::kAny, N::kNothing, K::kQ8_0Rows},
    {L::kQ8_0Int8Rows, P::kAny, N::kNothing, K::kQ8_0Int8Rows},
    {L::kQ8_0Interleaved, P::kAny, N::kNothing, K::kQ8_0Int8Interleaved},
    // INT4 layers with int8 activations (the default on AVX2 and AVX512-VNNI)
    {L::kW4Int8Interleaved, P::kPrefill, N::kW8A8Copy, K::kW4W8A8},
    {L::kW4Int8Interleaved, P::kPrefill, N::kAmxBf16, K::kW4AmxBf16},
    {L::kW4Int8Interleaved, P::kAny, N::kNothing, K::kW4Int8},
    {L::kW4Int8Rows, P::kAny, N::kNothing, K::kW4Int8Rows},
    // INT4 layers with bf16 activations (--decode-act bf16, CPUs without SIMD int8)
    {L::kW4Interleaved, P::kPrefill, N::kBf16Dot, K::kW4DequantBf16Tiles},
    {L::kW4Interleaved, P::kPrefill, N::kNothing, K::kW4DequantF32Tiles},
    {L::kW4Interleaved, P::kDecode, N::kNothing, K::kW4Bf16Interleaved},
    {L::kW4Rows, P::kPrefill, N::kBf16Dot, K::kW4DequantBf16Tiles},
    {L::kW4Rows, P::kPrefill, N::kNothing, K::kW4DequantF32Tiles},
    {L::kW4Rows, P::kDecode, N::kBf16Rows, K::kW4Bf16Rows},
    {L::kW4Rows, P::kDecode, N::kNothing, K::kW4Rows},
};

bool need_met(Need need, const Matrix& w) {
  switch (need) {
    case N::kNothing: return true;
    case N::kBf16Dot: return bf16_dot_available() && w.cols % 32 == 0;
    case N::kBf16Rows: return gemv_w4_bf16_supported(w);
    case N::kW8A8Copy: return w.interleaved_int8 != nullptr && !w.interleaved_int8->w8.empty();
    case N::kAmxBf16: return amx_prefill_enabled();
  }
  return false;
}

// Whether int8 activations go to this matrix's products: the copy for a layer, the rows as
// stored for a head. A Q8_0 matrix or a head only where the layers are quantized too (the
// float32 source form and the BF16/FP16 baselines keep float activations) and a SIMD path runs it.
bool int8_matrix(const Matrix& w, bool quantized_model, DecodeActivations activations) {
  const bool shape = (w.type == WeightType::kQ8_0 && w.cols % 32 == 0) || w4_rows_supported(w);
  return quantized_model && shape && w4_int8_chosen(activations) && int8_simd_available();
}

// The best Highway target this CPU runs (Highway orders targets best first, lowest bit).
std::string highway_target() {
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  std::string name = hwy::TargetName(targets & -targets);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

std::span<const KernelRule> kernel_rules() { return kRules; }

WeightLayout layout_of(const Matrix& w) {
  switch (w.type) {
    case WeightType::kF32: return L::kF32Rows;
    case WeightType::kF16: return L::kF16Rows;
    case WeightType::kBF16: return L::kBF16Rows;
    case WeightType::kQ8_0:
      if (w.interleaved_q8 != nullptr) return L::kQ8_0Interleaved;
      return w.int8_rows ? L::kQ8_0Int8Rows : L::kQ8_0Rows;
    case WeightType::kW4:
      if (w.interleaved_int8 != nullptr) return L::kW4Int8Interleaved;
      if (w.int8_rows) return L::kW4Int8Rows;
      return w.interleaved != nullptr ? L::kW4Interleaved : L::kW4Rows;
  }
  return L::kF32Rows;
}

Kernel choose_kernel(const Matrix& w, size_t product_tokens) {
  const WeightLayout layout = layout_of(w);
  const Phase phase = phase_of(product_tokens);
  for (const KernelRule& rule : kRules) {
    if (rule.layout == layout && (rule.phase == P::kAny || rule.phase == phase) && need_met(rule.need, w)) {
      return rule.kernel;
    }
  }
  return K::kF32Tiles;  // unreachable: every layout ends with a rule that needs nothing
}

WeightLayout choose_layout(const Matrix& stored, MatrixRole role, bool quantized_model, DecodeActivations activations) {
  const WeightLayout as_stored = layout_of(stored);
  switch (role) {
    case MatrixRole::kLayer:
      if (stored.type == WeightType::kQ8_0) {
        return int8_matrix(stored, quantized_model, activations) ? L::kQ8_0Interleaved : as_stored;
      }
      if (stored.type != WeightType::kW4) return as_stored;
      // An image that stores the int8 layout: read in place where int8 activations are chosen,
      // else the row-major rows (the loader de-interleaves them and asks again).
      if (stored.data == nullptr && stored.interleaved_int8 != nullptr) {
        return w4_int8_chosen(activations) ? L::kW4Int8Interleaved : L::kW4Rows;
      }
      if (w4_int8_chosen(activations) && w4_int8_supported(stored)) return L::kW4Int8Interleaved;
      return w4_interleavable(stored) ? L::kW4Interleaved : as_stored;
    case MatrixRole::kHead:
      // An INT4 head's copy would be 335 MB for Gemma 4: its rows as stored instead.
      if (!int8_matrix(stored, quantized_model, activations)) return as_stored;
      return stored.type == WeightType::kW4 ? L::kW4Int8Rows : L::kQ8_0Interleaved;
    case MatrixRole::kHeadInPlace:
      if (!int8_matrix(stored, quantized_model, activations)) return as_stored;
      return stored.type == WeightType::kW4 ? L::kW4Int8Rows : L::kQ8_0Int8Rows;
  }
  return as_stored;
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case K::kF32Tiles: return "f32-tiles";
    case K::kHalfRows: return "half-rows";
    case K::kHalfTilesF32: return "half-f32-tiles";
    case K::kBf16Tiles: return "bf16-tiles";
    case K::kQ8_0Rows: return "q8_0-rows";
    case K::kQ8_0Int8Rows: return "q8_0-int8-rows";
    case K::kQ8_0Int8Interleaved: return "q8_0-int8-interleaved";
    case K::kW4Rows: return "w4-rows";
    case K::kW4Bf16Rows: return "w4-bf16-rows";
    case K::kW4Bf16Interleaved: return "w4-bf16-interleaved";
    case K::kW4DequantBf16Tiles: return "w4-bf16-tiles";
    case K::kW4DequantF32Tiles: return "w4-f32-tiles";
    case K::kW4Int8: return "w4-int8";
    case K::kW4W8A8: return "w4-w8a8";
    case K::kW4AmxBf16: return "w4-amx-bf16";
    case K::kW4Int8Rows: return "w4-int8-rows";
  }
  return "?";
}

std::string kernel_label(Kernel k) {
  std::string isa;
  switch (k) {
    case K::kBf16Tiles:
    case K::kW4Bf16Rows:
    case K::kW4Bf16Interleaved:
    case K::kW4DequantBf16Tiles:
      isa = "avx512bf16";
      break;
    case K::kQ8_0Int8Rows:
    case K::kQ8_0Int8Interleaved:
    case K::kW4Int8:
    case K::kW4W8A8:
    case K::kW4Int8Rows:
      isa = int8_isa_name(best_int8_isa());
      break;
    case K::kW4AmxBf16:
      isa = "amx";
      break;
    default:
      isa = highway_target();
  }
  return std::string(kernel_name(k)) + "." + isa;
}

bool kernel_batch_invariant(const Matrix& w) {
  return choose_kernel(w, 1) == choose_kernel(w, kTileMinTokens);
}

}  // namespace kestrel::kernels
