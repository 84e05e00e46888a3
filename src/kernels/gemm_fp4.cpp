// gemm_fp4: packing a checkpoint's FP4 weight and the scalar level (the dispatch shares
// gemm_fp8.cpp's job split). Built with -ffp-contract=off: the scalar level's roundings are the
// ones gemm_fp4.h states, which the AVX-512 BF16 level reproduces.
#include "kernels/gemm_fp4.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/gemm_fp8_internal.h"

namespace moeserve {

static_assert(PackedFp4Weight::kPanelCols == gemm_detail::kPanelCols);
static_assert(PackedFp4Weight::kBlockK == gemm_detail::kBlockK);

namespace {

constexpr int64_t kCols = PackedFp4Weight::kPanelCols;
constexpr int64_t kBk = PackedFp4Weight::kBlockK;
constexpr int64_t kSub = PackedFp4Weight::kSubK;

// ws(e) of gemm_fp4.h.
float ws(uint8_t e) {
  return e == 0 ? 0.0f : std::ldexp(1.0f, int(e) - 127);
}

}  // namespace

void PackedFp4Weight::byte_of(int64_t c, int64_t kk, int64_t* byte, int* shift) {
  const int64_t j = c / 16, w = 2 * (c % 16) + kk % 2;
  *byte = (kk / 2) * 64 + (w / 8) * 16 + 8 * (j % 2) + w % 8;
  *shift = int(j / 2) * 4;
}

uint8_t PackedFp4Weight::at(int64_t row, int64_t col) const {
  int64_t byte = 0;
  int shift = 0;
  byte_of(row % kPanelCols, col % kBlockK, &byte, &shift);
  return uint8_t((tile(row / kPanelCols, col / kBlockK)[byte] >> shift) & 15);
}

Result<PackedFp4Weight> pack_fp4_weight(const WeightView& w, const std::string& name) {
  CHECK(w.dtype == DType::kF4E2M1 && w.block_rows == 1 && w.block_cols == kSub,
        "pack_fp4_weight: an FP4 weight with 1 x 32 scales");
  if (w.rows <= 0 || w.cols <= 0 || w.cols % kSub != 0) {
    return InvalidArgument(fmt::format("{}: an FP4 weight of {} x {} (K must be a multiple of 32)",
                                       name, w.rows, w.cols));
  }
  PackedFp4Weight p;
  p.n = w.rows;
  p.k = w.cols;
  const size_t bytes = p.bytes();
  p.data = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)),
                                      [](uint8_t* q) { std::free(q); });
  CHECK(p.data != nullptr, "packing a weight: out of memory");
  std::memset(p.data.get(), 0, bytes);
  const int64_t kbn = p.k_blocks(), subs = w.cols / kSub;
  for (int64_t row = 0; row < w.rows; ++row) {
    const uint8_t* src = w.data + row * w.row_bytes();
    const int64_t panel = row / kCols, c = row % kCols;
    for (int64_t s = 0; s < subs; ++s) {
      const float scale = w.scale_inv[row * subs + s];
      int e = 0;
      const float mant = std::frexp(scale, &e);  // scale = mant * 2^e, mant in [0.5, 1)
      if (scale != 0.0f && (mant != 0.5f || e + 126 < 0 || e + 126 > 254)) {
        return InvalidArgument(fmt::format(
            "{}: row {} scale {} of columns {}..{} is not a power of two 2^(e - 127), e < 255",
            name, row, scale, s * kSub, s * kSub + kSub - 1));
      }
      // 2^(e - 127) is e + 126 biased; 0 and 2^-127 both become exponent 0 (ws(0) = 0).
      uint8_t* t = p.data.get() + (panel * kbn + (s * kSub) / kBk) * PackedFp4Weight::kTileBytes;
      t[PackedFp4Weight::kNibbleBytes + ((s * kSub) % kBk / kSub) * kCols + c] =
          scale == 0.0f ? 0 : uint8_t(e + 126);
    }
    // A source byte is a k-pair (k even in its low nibble): byte_of puts the pair's two codes
    // into neighbouring bytes, at the same nibble, 64 bytes on per pair.
    int64_t first = 0;
    int shift = 0;
    PackedFp4Weight::byte_of(c, 0, &first, &shift);
    for (int64_t kb = 0; kb < kbn; ++kb) {
      uint8_t* t = p.data.get() + (panel * kbn + kb) * PackedFp4Weight::kTileBytes + first;
      const int64_t pairs = std::min<int64_t>(kBk, w.cols - kb * kBk) / 2;
      const uint8_t* s = src + kb * (kBk / 2);
      for (int64_t q = 0; q < pairs; ++q) {
        t[q * 64] = uint8_t(t[q * 64] | ((s[q] & 15) << shift));
        t[q * 64 + 1] = uint8_t(t[q * 64 + 1] | ((s[q] >> 4) << shift));
      }
    }
  }
  return p;
}

namespace gemm_detail {

void panels_fp4_scalar(const GemmJob& job, int64_t p0, int64_t p1) {
  const int64_t kbn = job.k_blocks;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t c1 = std::min(kCols, job.n - p * kCols);
    for (int64_t i = 0; i < job.m; ++i) {
      const uint16_t* x = job.x + i * job.ldx;
      for (int64_t c = 0; c < c1; ++c) {
        float tot = 0;
        for (int64_t kb = 0; kb < kbn; ++kb) {
          const uint8_t* t = job.tiles + (p * kbn + kb) * PackedFp4Weight::kTileBytes;
          const int64_t k0 = kb * kBk;
          auto value = [&](int64_t kk) {  // x times v(w) of K index k0 + kk (0 past K)
            if (k0 + kk >= job.k) return 0.0f;
            int64_t byte = 0;
            int shift = 0;
            PackedFp4Weight::byte_of(c, kk, &byte, &shift);
            return bf16_to_f32(x[k0 + kk]) * fp4e2m1_to_f32((t[byte] >> shift) & 15);
          };
          for (int64_t sb = 0; sb < kBk / kSub; ++sb) {
            float sum = 0;
            for (int64_t kk = sb * kSub; kk < sb * kSub + kSub; kk += 2) {
              sum += value(kk + 1);  // exact products: one rounding per add, as an FMA
              sum += value(kk);
            }
            const float w = ws(t[PackedFp4Weight::kNibbleBytes + sb * kCols + c]);
            tot = kb == 0 && sb == 0 ? sum * w : std::fma(sum, w, tot);
          }
        }
        store_scalar(job, i, p * kCols + c, tot);
      }
    }
  }
}

}  // namespace gemm_detail
}  // namespace moeserve
