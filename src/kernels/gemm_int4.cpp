// gemm_int4: requantizing weights at load and the scalar level (the dispatch shares
// gemm_fp8.cpp's job split). Built with -ffp-contract=off: the scalar level's roundings are the
// ones gemm_int4.h states, which the VNNI level reproduces.
#include "kernels/gemm_int4.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/gemm_fp8_internal.h"

namespace moeserve {

static_assert(PackedInt4Weight::kPanelCols == gemm_detail::kPanelCols);
static_assert(PackedInt4Weight::kBlockK == gemm_detail::kBlockK);

namespace {

constexpr int64_t kCols = gemm_detail::kPanelCols;
constexpr int64_t kBk = gemm_detail::kBlockK;

// Where value (c, kk) of a tile (column c of the panel, kk in the K block) lies: its byte and
// whether it is the high nibble (gemm_int4.h's layout).
struct NibbleAt {
  int64_t byte;
  int shift;
};
NibbleAt nibble_at(int64_t c, int64_t kk) {
  const int64_t v = c * 4 + kk % 4;  // index in the quad's INT8 layout, 0..255
  return {(kk / 4) * 128 + (v / 128) * 64 + v % 64, int((v / 64) % 2) * 4};
}

float round_even(float v) {  // as gemm_int8.cpp: nearest, ties to even, for |v| < 2^22
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

}  // namespace

uint8_t PackedInt4Weight::at(int64_t row, int64_t col) const {
  const NibbleAt a = nibble_at(row % kPanelCols, col % kBlockK);
  return uint8_t((tile(row / kPanelCols, col / kBlockK)[a.byte] >> a.shift) & 15);
}

namespace {

// value(row, col): the weight's F32 value (exact). Panels [p0, p1) of p, whose tiles and scales
// are zero on entry.
template <class Value>
void pack_panels_int4(const Value& value, PackedInt4Weight& p, int64_t p0, int64_t p1) {
  const int64_t n = p.n, k = p.k, kbn = p.k_blocks();
  float v[kBk];
  for (int64_t panel = p0; panel < p1; ++panel) {
    for (int64_t kb = 0; kb < kbn; ++kb) {
      uint8_t* t = p.data.get() + (panel * kbn + kb) * PackedInt4Weight::kTileBytes;
      float* sw = &p.scales[size_t((panel * kbn + kb) * 2 * kCols)];
      float* mw = sw + kCols;
      const int64_t kw = std::min(kBk, k - kb * kBk);
      for (int64_t c = 0; c < kCols; ++c) {
        const int64_t row = panel * kCols + c;
        if (row >= n) continue;
        float lo = 0, hi = 0;
        for (int64_t kk = 0; kk < kw; ++kk) {
          v[kk] = value(row, kb * kBk + kk);
          lo = kk == 0 ? v[kk] : std::min(lo, v[kk]);
          hi = kk == 0 ? v[kk] : std::max(hi, v[kk]);
        }
        const float s = (hi - lo) / 15.0f;
        sw[c] = s;
        mw[c] = lo;
        if (s == 0) continue;  // one value: qw = 0, w = mw
        for (int64_t kk = 0; kk < kw; ++kk) {
          const float q = std::clamp(round_even((v[kk] - lo) / s), 0.0f, 15.0f);
          const NibbleAt a = nibble_at(c, kk);
          t[a.byte] = uint8_t(t[a.byte] | (uint8_t(q) << a.shift));
        }
      }
    }
  }
}

// Zeroed tiles and scales of an [n, k] weight.
PackedInt4Weight empty_packed_int4(int64_t n, int64_t k) {
  CHECK(n > 0 && k > 0, "pack_int4_weight: empty weight");
  PackedInt4Weight p;
  p.n = n;
  p.k = k;
  const size_t bytes = p.tile_bytes();
  p.data = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)),
                                      [](uint8_t* q) { std::free(q); });
  CHECK(p.data != nullptr, "packing a weight: out of memory");
  std::memset(p.data.get(), 0, bytes);
  p.scales.assign(size_t(p.n_panels() * p.k_blocks() * 2 * kCols), 0.0f);
  return p;
}

template <class Value>
PackedInt4Weight pack_int4(const Value& value, int64_t n, int64_t k, ThreadPool* pool = nullptr) {
  PackedInt4Weight p = empty_packed_int4(n, k);
  auto panels = [&](int64_t p0, int64_t p1) { pack_panels_int4(value, p, p0, p1); };
  if (pool) {
    pool->parallel_for(p.n_panels(), panels);
  } else {
    panels(0, p.n_panels());
  }
  return p;
}

}  // namespace

PackedInt4Weight pack_int4_weight(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k) {
  const int64_t kbn = (k + kBk - 1) / kBk;
  return pack_int4(
      [&](int64_t row, int64_t col) {
        return fp8e4m3_to_f32(w[row * k + col]) * scale_inv[(row / kBk) * kbn + col / kBk];
      },
      n, k);
}

PackedInt4Weight pack_int4_weight_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw,
                                       ThreadPool* pool) {
  CHECK(ldw >= k, "pack_int4_weight_bf16: row stride shorter than a row");
  return pack_int4([&](int64_t row, int64_t col) { return bf16_to_f32(w[row * ldw + col]); }, n, k,
                   pool);
}

PackedInt4Weight pack_int4_weight(const PackedFp8Weight& w) {
  const int64_t kbn = w.k_blocks();
  return pack_int4(
      [&](int64_t row, int64_t col) {
        return fp8e4m3_to_f32(w.at(row, col)) * w.scale_inv[size_t((row / kBk) * kbn + col / kBk)];
      },
      w.n, w.k);
}

namespace gemm_detail {

void panels_int4_scalar(const GemmJob& job, int64_t p0, int64_t p1) {
  const int64_t kbn = job.k_blocks;
  std::vector<int8_t> q(size_t(job.m * kbn * kBk));
  std::vector<float> sx(size_t(job.m * kbn));
  std::vector<int32_t> sums(size_t(job.m * kbn));
  quantize_rows_int8_scalar(job.x, job.ldx, job.m, job.m, job.k, q.data(), sx.data(), sums.data());
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t c1 = std::min(kCols, job.n - p * kCols);
    for (int64_t i = 0; i < job.m; ++i) {
      for (int64_t c = 0; c < c1; ++c) {
        float tot = 0;
        for (int64_t kb = 0; kb < kbn; ++kb) {
          const uint8_t* t = job.tiles + (p * kbn + kb) * PackedInt4Weight::kTileBytes;
          const int8_t* xq = &q[size_t((kb * job.m + i) * kBk)];
          int32_t dot = 0;
          for (int64_t kk = 0; kk < kBk; ++kk) {
            const NibbleAt a = nibble_at(c, kk);
            dot += int32_t(xq[kk]) * ((t[a.byte] >> a.shift) & 15);
          }
          const float* sw = job.scales + (p * kbn + kb) * 2 * kCols;
          const float sxv = sx[size_t(kb * job.m + i)];
          const float sumx = float(sums[size_t(kb * job.m + i)]);
          const float tb = std::fma(float(dot), sw[c], sw[kCols + c] * sumx);
          tot = kb == 0 ? tb * sxv : std::fma(tb, sxv, tot);
        }
        store_scalar(job, i, p * kCols + c, tot);
      }
    }
  }
}

}  // namespace gemm_detail
}  // namespace moeserve
