// gemm_int8: requantizing weights at load, the scalar level and its activation quantization.
// (The dispatch shares gemm_fp8.cpp's job split.) Built with -ffp-contract=off: the scalar
// level's roundings are the ones gemm_int8.h states, which the SIMD levels reproduce.
#include "kernels/gemm_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/gemm_fp8_internal.h"

namespace moeserve {

static_assert(PackedInt8Weight::kPanelCols == gemm_detail::kPanelCols);
static_assert(PackedInt8Weight::kBlockK == gemm_detail::kBlockK);
static_assert(PackedInt8Weight::kTileBytes == gemm_detail::kTileBytes);

namespace {

constexpr int64_t kCols = gemm_detail::kPanelCols;
constexpr int64_t kBk = gemm_detail::kBlockK;

// Offset of qw[c][kk] (column c of the panel, kk in the K block) inside a tile.
int64_t quad_offset(int64_t c, int64_t kk) {
  return (kk / 4) * (kCols * 4) + c * 4 + kk % 4;
}

// v rounded to the nearest integer, ties to even, for |v| < 2^22: adding and subtracting 1.5 * 2^23
// rounds in the default rounding mode exactly as nearbyint does, without the libm call the
// baseline ISA (no ROUNDSS) makes per value (packing V3's weights is billions of them).
float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// One group of `n` values quantized symmetrically: q = round-to-nearest-even(v * (127 / max|v|)),
// returning the scale max|v| / 127 (0 for all zeros, NaN when a value is not finite; q = 0 then).
// The activations' quantizer below and the SIMD levels' use exactly these operations.
float quantize_group(const float* v, int64_t n, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    if (!(a <= std::numeric_limits<float>::max())) finite = false;
    amax = std::max(amax, a);
  }
  if (!finite || amax == 0) {
    std::fill(q, q + n, int8_t(0));
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) q[i] = int8_t(round_even(v[i] * inv));
  return amax / 127.0f;
}

// Panels [p0, p1) of a weight whose value at (row, col) is value(row, col) (F32, exact).
template <class Value>
void pack_panels_int8(const Value& value, int64_t n, int64_t k, PackedInt8Weight& p, int64_t p0,
                      int64_t p1) {
  const int64_t kbn = p.k_blocks();
  float v[kBk];
  int8_t q[kBk];
  for (int64_t panel = p0; panel < p1; ++panel) {
    for (int64_t kb = 0; kb < kbn; ++kb) {
      int8_t* t = p.data.get() + (panel * kbn + kb) * gemm_detail::kTileBytes;
      float* s = &p.scales[size_t((panel * kbn + kb) * kCols)];
      std::memset(t, 0, gemm_detail::kTileBytes);
      const int64_t kw = std::min(kBk, k - kb * kBk);
      for (int64_t c = 0; c < kCols; ++c) {
        const int64_t row = panel * kCols + c;
        if (row >= n) {
          s[c] = 0;
          continue;
        }
        for (int64_t kk = 0; kk < kw; ++kk) v[kk] = value(row, kb * kBk + kk);
        s[c] = quantize_group(v, kw, q);
        for (int64_t kk = 0; kk < kw; ++kk) t[quad_offset(c, kk)] = q[kk];
      }
    }
  }
}

PackedInt8Weight empty_packed(int64_t n, int64_t k) {
  CHECK(n > 0 && k > 0, "pack_int8_weight: empty weight");
  PackedInt8Weight p;
  p.n = n;
  p.k = k;
  const size_t bytes = size_t(p.n_panels() * p.k_blocks() * gemm_detail::kTileBytes);
  p.data = std::shared_ptr<int8_t[]>(static_cast<int8_t*>(std::aligned_alloc(64, bytes)),
                                     [](int8_t* q) { std::free(q); });
  CHECK(p.data != nullptr, "packing a weight: out of memory");
  p.scales.assign(size_t(p.n_panels() * p.k_blocks() * kCols), 0.0f);
  return p;
}

}  // namespace

int8_t PackedInt8Weight::at(int64_t row, int64_t col) const {
  return tile(row / kPanelCols, col / kBlockK)[quad_offset(row % kPanelCols, col % kBlockK)];
}

PackedInt8Weight pack_int8_weight(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k) {
  PackedInt8Weight p = empty_packed(n, k);
  const int64_t kbn = p.k_blocks();
  auto value = [&](int64_t row, int64_t col) {
    return fp8e4m3_to_f32(w[row * k + col]) * scale_inv[(row / kBk) * kbn + col / kBk];
  };
  pack_panels_int8(value, n, k, p, 0, p.n_panels());
  return p;
}

PackedInt8Weight pack_int8_weight(const PackedFp8Weight& w) {
  PackedInt8Weight p = empty_packed(w.n, w.k);
  const int64_t kbn = p.k_blocks();
  auto value = [&](int64_t row, int64_t col) {
    return fp8e4m3_to_f32(w.at(row, col)) * w.scale_inv[size_t((row / kBk) * kbn + col / kBk)];
  };
  pack_panels_int8(value, w.n, w.k, p, 0, p.n_panels());
  return p;
}

PackedInt8Weight pack_int8_weight_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw,
                                       ThreadPool* pool) {
  CHECK(ldw >= k, "pack_int8_weight_bf16: row stride shorter than a row");
  PackedInt8Weight p = empty_packed(n, k);
  auto value = [&](int64_t row, int64_t col) { return bf16_to_f32(w[row * ldw + col]); };
  auto panels = [&](int64_t p0, int64_t p1) { pack_panels_int8(value, n, k, p, p0, p1); };
  if (pool) {
    pool->parallel_for(p.n_panels(), panels);
  } else {
    panels(0, p.n_panels());
  }
  return p;
}

void quantize_row_int8(const uint16_t* x, int64_t k, int8_t* q, float* sx) {
  const int64_t kbn = (k + kBk - 1) / kBk;
  float v[kBk];
  for (int64_t kb = 0; kb < kbn; ++kb) {
    const int64_t kw = std::min(kBk, k - kb * kBk);
    std::fill(v, v + kBk, 0.0f);
    for (int64_t kk = 0; kk < kw; ++kk) v[kk] = bf16_to_f32(x[kb * kBk + kk]);
    sx[kb] = quantize_group(v, kBk, q + kb * kBk);
  }
}

namespace gemm_detail {

void quantize_rows_int8_scalar(const uint16_t* x, int64_t ldx, int64_t rows, int64_t rows_pad,
                               int64_t k, int8_t* q, float* sx, int32_t* sums) {
  const int64_t kbn = (k + kBk - 1) / kBk;
  int8_t row_q[kBk];
  for (int64_t r = 0; r < rows_pad; ++r) {
    for (int64_t kb = 0; kb < kbn; ++kb) {
      int8_t* d = q + (kb * rows_pad + r) * kBk;
      float& s = sx[kb * rows_pad + r];
      int32_t& sum = sums[kb * rows_pad + r];
      if (r >= rows) {
        std::memset(d, 0, kBk);
        s = 0;
        sum = 0;
        continue;
      }
      const int64_t kw = std::min(kBk, k - kb * kBk);
      float v[kBk] = {};
      for (int64_t kk = 0; kk < kw; ++kk) v[kk] = bf16_to_f32(x[r * ldx + kb * kBk + kk]);
      s = quantize_group(v, kBk, row_q);
      std::memcpy(d, row_q, kBk);
      sum = 0;
      for (int64_t kk = 0; kk < kBk; ++kk) sum += row_q[kk];
    }
  }
}

void store_scalar(const GemmJob& job, int64_t row, int64_t col, float v) {
  if (job.y_bf16) {
    static_cast<uint16_t*>(job.y)[row * job.ldy + col] = f32_to_bf16(v);
  } else {
    static_cast<float*>(job.y)[row * job.ldy + col] = v;
  }
}

void panels_int8_scalar(const GemmJob& job, int64_t p0, int64_t p1) {
  const int64_t kbn = job.k_blocks;
  std::vector<int8_t> q(size_t(job.m * kbn * kBk));
  std::vector<float> sx(size_t(job.m * kbn));
  std::vector<int32_t> sums(size_t(job.m * kbn));
  quantize_rows_int8_scalar(job.x, job.ldx, job.m, job.m, job.k, q.data(), sx.data(), sums.data());
  const auto* tiles = reinterpret_cast<const int8_t*>(job.tiles);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t c1 = std::min(kCols, job.n - p * kCols);
    for (int64_t i = 0; i < job.m; ++i) {
      for (int64_t c = 0; c < c1; ++c) {
        float tot = 0;
        for (int64_t kb = 0; kb < kbn; ++kb) {
          const int8_t* t = tiles + (p * kbn + kb) * kTileBytes;
          const int8_t* xq = &q[size_t((kb * job.m + i) * kBk)];
          int32_t dot = 0;
          for (int64_t kk = 0; kk < kBk; ++kk) dot += int32_t(xq[kk]) * t[quad_offset(c, kk)];
          const float s = sx[size_t(kb * job.m + i)] * job.scales[(p * kbn + kb) * kCols + c];
          tot = kb == 0 ? float(dot) * s : std::fma(float(dot), s, tot);
        }
        store_scalar(job, i, p * kCols + c, tot);
      }
    }
  }
}

}  // namespace gemm_detail
}  // namespace moeserve
