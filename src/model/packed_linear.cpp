#include "model/packed_linear.h"

#include <vector>

#include "core/check.h"

namespace moeserve {

PackedLinear pack_linear(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k,
                         bool int8) {
  PackedLinear p;
  if (int8) {
    p.int8 = pack_int8_weight(w, scale_inv, n, k);
  } else {
    p.fp8 = pack_fp8_weight(w, scale_inv, n, k);
  }
  return p;
}

void gemm_linear(const uint16_t* x, int64_t m, int64_t ldx, const PackedLinear& w, GemmOutput y,
                 ThreadPool* pool) {
  if (w.is_int8()) {
    gemm_int8(x, m, ldx, w.int8, y, pool);
  } else {
    gemm_fp8(x, m, ldx, w.fp8, y, pool);
  }
}

void gemm_linear_grouped(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                         const int64_t* offsets, std::span<const PackedLinear* const> experts,
                         GemmOutput y, ThreadPool* pool) {
  if (experts.empty()) return;
  const bool int8 = experts[0]->is_int8();
  const int64_t n = int64_t(experts.size());
  if (int8) {
    std::vector<const PackedInt8Weight*> w(experts.size());
    for (size_t e = 0; e < experts.size(); ++e) {
      CHECK(experts[e]->is_int8(), "grouped GEMM: experts of mixed formats");
      w[e] = &experts[e]->int8;
    }
    if (x_rows) {
      gemm_int8_grouped_contiguous_gather(x, ldx, x_rows, offsets, w.data(), n, y, pool);
    } else {
      gemm_int8_grouped_contiguous(x, ldx, offsets, w.data(), n, y, pool);
    }
    return;
  }
  std::vector<const PackedFp8Weight*> w(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    CHECK(!experts[e]->is_int8(), "grouped GEMM: experts of mixed formats");
    w[e] = &experts[e]->fp8;
  }
  if (x_rows) {
    gemm_fp8_grouped_contiguous_gather(x, ldx, x_rows, offsets, w.data(), n, y, pool);
  } else {
    gemm_fp8_grouped_contiguous(x, ldx, offsets, w.data(), n, y, pool);
  }
}

}  // namespace moeserve
