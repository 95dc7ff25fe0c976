// Element-wise and per-vector operations of the transformer block, float32 in and out.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kestrel::kernels {

/// y = x / sqrt(mean(x^2) + eps) * weight, over n elements (x and y may alias).
/// Gemma's GGUF weights already hold (1 + w) (llama.cpp convert_hf_to_gguf.py, Gemma3Model).
void rms_norm(const float* x, const float* weight, float* y, size_t n, float eps);

/// Same, without a weight (Gemma 4's V-norm).
void rms_norm_unweighted(const float* x, float* y, size_t n, float eps);

/// y = gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
/// (Hendrycks & Gimpel 2016; HF "gelu_pytorch_tanh"). y may alias gate or up.
void gelu_tanh_mul(const float* gate, const float* up, float* y, size_t n);

/// In place: z = cap * tanh(z / cap) over n elements (Gemma's final logit soft-capping; Gemma 2
/// paper, arXiv 2408.00118, sec. 2). Vectorized (Highway's Tanh, within a few ulp of
/// std::tanh); every element takes the same vector path, the last partial vector included, so a
/// value's result does not depend on its position or on n. cap must be positive.
void softcap(float* z, size_t n, float cap);

/// y += x over n elements.
void add_inplace(float* y, const float* x, size_t n);

/// y *= s over n elements.
void scale_inplace(float* y, float s, size_t n);

/// NeoX-style rotary embedding ("rotate half", HF apply_rotary_pos_emb) on n_heads vectors of
/// head_dim laid out back to back: for i < n_rot/2, (x[i], x[i + n_rot/2]) is rotated by the
/// angle whose cos/sin are cos_sin[2i], cos_sin[2i+1]. Elements past n_rot are left as they are.
void rope_neox(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin);

/// float32 -> IEEE fp16 with round-to-nearest-even.
void to_fp16(const float* x, uint16_t* y, size_t n);

/// Attention of one query head over a window of cached positions.
///   q:        float32 [head_dim], already multiplied by the attention scale;
///   k, v:     fp16 cache of one KV head: position p lives in slot p % capacity, slot s at
///             k + s * stride (elements);
///   [pos_begin, pos_end): the positions the query sees (causal and sliding-window mask applied
///             by the caller's choice of range);
///   scores:   scratch of at least pos_end - pos_begin floats;
///   out:      float32 [head_dim] = sum_p softmax(q.k_p) v_p.
void attend(const float* q, const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity,
            size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out);

/// attend() for the `group` query heads that share one KV head (grouped-query attention,
/// Ainslie et al. 2023): q and out are [group, head_dim] back to back, scores needs
/// group * (pos_end - pos_begin) floats. Each K and V row is read once for the whole group.
void attend_group(const float* q, size_t group, const uint16_t* k, const uint16_t* v,
                  size_t stride, size_t capacity, size_t head_dim, size_t pos_begin,
                  size_t pos_end, float* scores, float* out);

/// Prefill tile of attention: n_queries (1..kMaxBlockQueries) query vectors of one KV head, query
/// i seeing positions [begins[i], ends[i]) (its causal / sliding-window range). K and V rows of
/// the union of the ranges are read once for all queries. `scores` needs n_queries * (max end
/// - min begin) floats; outs[i] receives query i's output [head_dim]. head_dim must be a
/// multiple of 16. Throws kestrel::Error otherwise. Float32 products (the fp16 cache widened
/// exactly): per query the same bits as attend() over its range, on every SIMD target.
/// (attention_bf16.h has the bfloat16 tile prefill uses where the CPU has AVX512-BF16.)
constexpr size_t kMaxBlockQueries = 16;
void attend_block(const float* const* queries, size_t n_queries, const size_t* begins,
                  const size_t* ends, const uint16_t* k, const uint16_t* v, size_t stride,
                  size_t capacity, size_t head_dim, float* scores, float* const* outs);

/// In place: scores[0..n) = exp(scores - max) with max their maximum (written to *max_out);
/// returns the sum. Vectorized (Highway's Exp, ~1 ulp).
float exp_shifted(float* scores, size_t n, float* max_out);

/// sum_i exp(double(x[i]) - shift) in float64: the log-sum-exp of a logit row for
/// runtime::compute_logprobs (what prompt scoring runs on every row). Vectorized with Highway's
/// float64 Exp (max error 1 ulp), lanes summed apart then together: against a sequential
/// std::exp loop the sum differs within the two sums' rounding (tests/unit/test_kernels.cpp).
/// x[i] - shift below -745 (exp underflows to 0), -inf included, adds 0; NaN propagates.
double sum_exp_shifted(const float* x, size_t n, double shift);

/// The attention of `group` heads over part of the visible positions, unnormalized, so that
/// several threads can each take a slice of a long cache during decode and merge (the
/// log-sum-exp split of FlashDecoding, Dao et al. 2023). `out` must hold group * head_dim
/// floats; max and sum `group` each.
struct AttentionPartial {
  float* out;
  float* max;
  float* sum;
};
void attend_partial(const float* q, size_t group, const uint16_t* k, const uint16_t* v,
                    size_t stride, size_t capacity, size_t head_dim, size_t pos_begin,
                    size_t pos_end, float* scores, AttentionPartial* partial);
/// Combines partials over disjoint slices into the normalized output [group, head_dim].
void merge_partials(const AttentionPartial* parts, size_t n_parts, size_t group, size_t head_dim,
                    float* out);

}  // namespace kestrel::kernels
