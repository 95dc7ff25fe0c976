// The switches that steer which kernel computes a product, read in one place: the command line's
// `--kernels LIST` and the environment's KESTREL_KERNELS=LIST (docs/kernels.md). Every switch is
// for A/B runs and opt-in experiments; the defaults are the measured fastest choice for the CPU at
// hand (kernels/registry.h holds the table that uses them).
//
// LIST is comma-separated names, each changing one switch from its default:
//   int8 | bf16      INT4 layers' activations where a load asks for "auto" (--decode-act auto):
//                    int8 or bf16 (default: int8 where the CPU has AVX2 or AVX512-VNNI)
//   no-avx2          the int8 kernels' AVX2 path off (portable, or AVX512-VNNI if present)
//   no-vnni          the int8 kernels' AVX512-VNNI path off
//   no-bf16-dot      AVX512-BF16 dot products off (prefill tiles, bf16 attention, bf16 decode)
//   no-bf16-attention   AVX512-BF16 attention off, the rest of AVX512-BF16 kept
//   no-interleave    bf16 decode on the row-major INT4 kernel instead of its interleaved copy
//   amx              prefill of INT4 layers on AMX-BF16 tiles (opt-in; bf16 activations)
//   w8a8             the W8A8 prefill copy of INT4 layers with 8-bit group parameters (opt-in)
//   default          nothing changed (an empty LIST too)
// The variables of earlier releases (KESTREL_W4_INT8, KESTREL_AMX, KESTREL_W8A8, KESTREL_NO_VNNI,
// KESTREL_NO_AVX2, KESTREL_NO_INTERLEAVE, KESTREL_NO_BF16_DOT, KESTREL_NO_BF16_ATTENTION) are
// read here too, as aliases of those names, under KESTREL_KERNELS and `--kernels`.
#pragma once

#include <string>
#include <string_view>

namespace kestrel::kernels {

/// What the INT4 products (decode rows and, for int8, prefill chunks) round the activations to:
/// bf16 (gemv_w4_interleaved.h, gemv_w4_bf16.h) or int8 (gemv_w4_int8.h). kAuto: the process
/// default, w4_int8_default().
enum class DecodeActivations { kAuto, kBf16, kInt8 };

/// The kernel switches of a process. Default-constructed: every kernel the CPU has, no opt-ins.
struct KernelOptions {
  DecodeActivations activations = DecodeActivations::kAuto;  // "int8" / "bf16"
  bool avx2 = true;            // "no-avx2"
  bool avx512_vnni = true;     // "no-vnni"
  bool bf16_dot = true;        // "no-bf16-dot"
  bool bf16_attention = true;  // "no-bf16-attention"
  bool interleave = true;      // "no-interleave"
  bool amx = false;            // "amx"
  bool w8a8 = false;           // "w8a8"
  bool operator==(const KernelOptions&) const = default;
};

/// `base` with the switches named in `list` (the header's names, comma-separated, blanks around
/// a name ignored) changed. Throws kestrel::Error naming `source` (e.g. "--kernels") and the
/// known names for an unknown name.
KernelOptions parse_kernel_options(std::string_view list, std::string_view source,
                                   const KernelOptions& base = {});

/// The canonical LIST of `o`: the names of its switches that differ from the defaults, in the
/// header's order, or "default".
std::string kernel_options_name(const KernelOptions& o);

/// The process's switches: on first use, the defaults changed by the earlier releases' variables
/// and then by KESTREL_KERNELS (throws kestrel::Error for a bad value, and again on the next
/// call); later, whatever set_kernel_options gave.
const KernelOptions& kernel_options();

/// Replaces the process's switches (`--kernels`). Call before a model loads: the copies a load
/// makes follow the switches in force then.
void set_kernel_options(const KernelOptions& o);

}  // namespace kestrel::kernels
