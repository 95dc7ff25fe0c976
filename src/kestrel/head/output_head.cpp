#include "kestrel/head/output_head.h"

#include <cmath>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_w4_rows.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::head {

void OutputHead::set_row_order(std::span<const TokenId> order) {
  if (order.size() != weight.rows) {
    throw Error("head row order has " + std::to_string(order.size()) + " entries for " +
                std::to_string(weight.rows) + " rows");
  }
  std::vector<uint32_t> rows(order.size(), UINT32_MAX);
  for (size_t r = 0; r < order.size(); ++r) {
    const TokenId t = order[r];
    if (t < 0 || static_cast<size_t>(t) >= order.size() || rows[static_cast<size_t>(t)] != UINT32_MAX) {
      throw Error("head row order is not a permutation of the vocabulary (row " + std::to_string(r) +
                  " holds token " + std::to_string(t) + ")");
    }
    rows[static_cast<size_t>(t)] = static_cast<uint32_t>(r);
  }
  row_tokens = order;
  token_rows = std::move(rows);
}

void apply_softcap(float* z, size_t n, float cap) {
  if (cap > 0.0f) kernels::softcap(z, n, cap);
}

void dense_logits_row_order(const OutputHead& head, const float* hidden, size_t n_rows, float* logits,
                            ThreadPool& pool) {
  const size_t v = head.n_vocab(), d = head.weight.cols;
  kernels::matmul(head.weight, hidden, n_rows, d, logits, v, pool);
  // Over the logits, not the rows: a decode step's one row of 262,144 is the whole job.
  pool.parallel_for(n_rows * v, 1 << 14, [&](size_t b, size_t e) {
    apply_softcap(logits + b, e - b, head.final_softcap);
  });
}

void dense_logits(const OutputHead& head, const float* hidden, size_t n_rows, float* logits,
                  ThreadPool& pool) {
  if (head.row_tokens.empty()) return dense_logits_row_order(head, hidden, n_rows, logits, pool);
  const size_t v = head.n_vocab();
  std::vector<float> by_row(n_rows * v);
  dense_logits_row_order(head, hidden, n_rows, by_row.data(), pool);
  // Back to token order, split over the threads (a permutation: no two write one logit).
  pool.parallel_for(n_rows * v, 1 << 14, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const size_t t = i / v, r = i % v;
      logits[t * v + static_cast<size_t>(head.row_tokens[r])] = by_row[i];
    }
  });
}

void token_logits(const OutputHead& head, const float* hidden, std::span<const TokenId> tokens, float* logits,
                  ThreadPool& pool) {
  const size_t d = head.weight.cols;
  pool.parallel_for(tokens.size(), 32, [&](size_t b, size_t e) {
    if (head.weight.interleaved_q8 != nullptr) {
      // A head that takes int8 activations (dense_logits runs it on gemv_q8_interleaved): the
      // same quantization and the same bits per row, so rescored logits equal the dense ones.
      thread_local kernels::Q8Activations xq;
      kernels::quantize_q8_activations(hidden, 1, d, d, xq);
      for (size_t i = b; i < e; ++i) {
        logits[i] = kernels::gemv_q8_interleaved_row(*head.weight.interleaved_q8, xq, 0, head.row_of(tokens[i]));
      }
    } else if (head.weight.int8_rows) {  // the same, from the rows as stored (gemv_w4_rows.h)
      thread_local kernels::Q8Activations xq;
      kernels::quantize_q8_activations(hidden, 1, d, d, xq);
      for (size_t i = b; i < e; ++i) {
        const kernels::Matrix one = kernels::row_slice(head.weight, head.row_of(tokens[i]), 1);
        kernels::gemv_int8_rows(one, xq, 0, 1, &logits[i], 1, 0, 1);
      }
    } else {
      for (size_t i = b; i < e; ++i) {
        const size_t row = head.row_of(tokens[i]);
        const kernels::Matrix one = kernels::row_slice(head.weight, row, 1);
        kernels::matmul_rows(one, hidden, 1, d, &logits[i], 1, 0, 1);
      }
    }
    apply_softcap(logits + b, e - b, head.final_softcap);
  });
}

}  // namespace kestrel::head
