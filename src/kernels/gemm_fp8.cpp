// Packing and dispatch for gemm_fp8, gemm_fp8_f32x and gemm_int8: picks the ISA level and splits
// panels among threads.
#include "kernels/gemm_fp8.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/gemm_fp4.h"
#include "kernels/gemm_fp8_f32x.h"
#include "kernels/gemm_fp8_internal.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_int8.h"

namespace moeserve {

using gemm_detail::GemmJob;

static_assert(PackedFp8Weight::kPanelCols == gemm_detail::kPanelCols);
static_assert(PackedFp8Weight::kBlockK == gemm_detail::kBlockK);
static_assert(PackedBf16Weight::kTileElems == gemm_detail::kTileBytes);

namespace {

// Both packed formats share one tile layout: tiles [n_panels][k_blocks], each
// [64 k-pairs][64 columns][2 k] elements (kTileBytes of them), zero-padded past N and K.
// Offset of W[row, col] in elements:
int64_t tile_offset(int64_t row, int64_t col, int64_t k_blocks) {
  const int64_t kk = col % gemm_detail::kBlockK;
  return ((row / gemm_detail::kPanelCols) * k_blocks + col / gemm_detail::kBlockK) *
             gemm_detail::kTileBytes +
         (kk / 2) * (gemm_detail::kPanelCols * 2) + (row % gemm_detail::kPanelCols) * 2 + kk % 2;
}

// Fills panels [p0, p1) of dst from w [n, k] (row stride ldw).
template <class T>
void pack_panels(const T* w, int64_t n, int64_t k, int64_t ldw, T* dst, int64_t p0, int64_t p1) {
  const int64_t kb_n = (k + gemm_detail::kBlockK - 1) / gemm_detail::kBlockK;
  for (int64_t panel = p0; panel < p1; ++panel) {
    for (int64_t kb = 0; kb < kb_n; ++kb) {
      T* t = dst + (panel * kb_n + kb) * gemm_detail::kTileBytes;
      std::memset(t, 0, gemm_detail::kTileBytes * sizeof(T));
      const int64_t k0 = kb * gemm_detail::kBlockK;
      const int64_t kw = std::min<int64_t>(gemm_detail::kBlockK, k - k0);
      for (int64_t c = 0; c < gemm_detail::kPanelCols; ++c) {
        const int64_t row = panel * gemm_detail::kPanelCols + c;
        if (row >= n) break;
        const T* src = w + row * ldw + k0;  // [kw]
        for (int64_t kk = 0; kk < kw; ++kk) t[(kk / 2) * 128 + c * 2 + kk % 2] = src[kk];
      }
    }
  }
}

// A 64-byte aligned block of `bytes`, freed with the last owner.
template <class T>
std::shared_ptr<T[]> aligned_block(size_t bytes) {
  std::shared_ptr<T[]> p(static_cast<T*>(std::aligned_alloc(64, bytes)),
                         [](T* q) { std::free(q); });
  CHECK(p != nullptr, "packing a weight: out of memory");
  return p;
}

}  // namespace

uint8_t PackedFp8Weight::at(int64_t row, int64_t col) const {
  return data[size_t(tile_offset(row, col, k_blocks()))];
}

PackedFp8Weight pack_fp8_weight(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k) {
  CHECK(n > 0 && k > 0, "pack_fp8_weight: empty weight");
  PackedFp8Weight p;
  p.n = n;
  p.k = k;
  p.data = aligned_block<uint8_t>(p.bytes());
  pack_panels(w, n, k, k, p.data.get(), 0, p.n_panels());
  p.scale_inv.assign(scale_inv, scale_inv + p.n_blocks() * p.k_blocks());
  return p;
}

uint16_t PackedBf16Weight::at(int64_t row, int64_t col) const {
  return data[size_t(tile_offset(row, col, k_blocks()))];
}

PackedBf16Weight pack_bf16_weight(const uint16_t* w, int64_t n, int64_t k, int64_t ldw,
                                  ThreadPool* pool) {
  CHECK(n > 0 && k > 0 && ldw >= k, "pack_bf16_weight: bad shape");
  PackedBf16Weight p;
  p.n = n;
  p.k = k;
  p.data = aligned_block<uint16_t>(p.bytes());
  auto panels = [&](int64_t p0, int64_t p1) { pack_panels(w, n, k, ldw, p.data.get(), p0, p1); };
  if (pool) {
    pool->parallel_for(p.n_panels(), panels);
  } else {
    panels(0, p.n_panels());
  }
  return p;
}

namespace {

using PanelFn = void (*)(const GemmJob&, int64_t, int64_t);

PanelFn panel_fn(Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "gemm_fp8: ISA level above what this CPU supports");
  switch (isa) {
    case Isa::kAmx:
      return gemm_detail::panels_amx;
    case Isa::kAvx512Bf16:
      return gemm_detail::panels_avx512bf16;
    case Isa::kAvx512:
      return gemm_detail::panels_avx512;
    case Isa::kAvx2:
      return gemm_detail::panels_avx2;
    case Isa::kScalar:
      break;
  }
  return gemm_detail::panels_scalar;
}

// The F32-activation levels: the AVX-512 levels run the AVX-512F kernel (no BF16 needed).
PanelFn panel_fn_f32x(Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "gemm_fp8_f32x: ISA level above what this CPU supports");
  switch (isa) {
    case Isa::kAmx:
    case Isa::kAvx512Bf16:
    case Isa::kAvx512:
      return gemm_detail::panels_f32x_avx512;
    case Isa::kAvx2:
      return gemm_detail::panels_f32x_avx2;
    case Isa::kScalar:
      break;
  }
  return gemm_detail::panels_f32x_scalar;
}

// What a job needs of its weight, for either packed format.
struct JobWeight {
  const uint8_t* tiles;
  const float* scales;
  int64_t n, k, k_blocks;
  bool int8;
};
JobWeight job_weight(const PackedFp8Weight& w) {
  return {w.data.get(), w.scale_inv.data(), w.n, w.k, w.k_blocks(), false};
}
JobWeight job_weight(const PackedInt4Weight& w) {
  return {w.data.get(), w.scales.data(), w.n, w.k, w.k_blocks(), true};
}
JobWeight job_weight(const PackedFp4Weight& w) {  // the exponents lie in the tiles
  return {w.data.get(), nullptr, w.n, w.k, w.k_blocks(), false};
}
JobWeight job_weight(const PackedInt8Weight& w) {
  return {reinterpret_cast<const uint8_t*>(w.data.get()),
          w.scales.data(),
          w.n,
          w.k,
          w.k_blocks(),
          true};
}
int64_t n_panels_of(const JobWeight& w) {
  return (w.n + gemm_detail::kPanelCols - 1) / gemm_detail::kPanelCols;
}

// The INT8 levels: VNNI needs AVX-512 BF16's CPUs (every one has VNNI); below, the scalar code.
PanelFn panel_fn_int8(Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "gemm_int8: ISA level above what this CPU supports");
  switch (isa) {
    case Isa::kAmx:
      return gemm_detail::panels_int8_amx;
    case Isa::kAvx512Bf16:
      return gemm_detail::panels_int8_vnni;
    default:
      return gemm_detail::panels_int8_scalar;
  }
}

// The INT4 levels: AMX (VNNI at few rows), VNNI on AVX-512 BF16's CPUs, below them the scalar
// code.
PanelFn panel_fn_int4(Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "gemm_int4: ISA level above what this CPU supports");
  switch (isa) {
    case Isa::kAmx:
      return gemm_detail::panels_int4_amx;
    case Isa::kAvx512Bf16:
      return gemm_detail::panels_int4_vnni;
    default:
      return gemm_detail::panels_int4_scalar;
  }
}

// The FP4 levels: AVX-512 BF16 (AMX's CPUs run it too: no tile form), else scalar.
PanelFn panel_fn_fp4(Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "gemm_fp4: ISA level above what this CPU supports");
  switch (isa) {
    case Isa::kAmx:
    case Isa::kAvx512Bf16:
      return gemm_detail::panels_fp4_avx512bf16;
    default:
      return gemm_detail::panels_fp4_scalar;
  }
}

// x (BF16) or xf (F32): exactly one is non-null.
GemmJob make_job(const uint16_t* x, const float* xf, int64_t m, int64_t ldx, const JobWeight& w,
                 const GemmOutput& y, int64_t row0) {
  CHECK(y.dtype == DType::kF32 || y.dtype == DType::kBF16, "gemm: output must be F32/BF16");
  CHECK(ldx >= w.k && y.ld >= w.n, "gemm: row stride shorter than a row");
  size_t esize = dtype_size(y.dtype);
  GemmJob job{x ? x + row0 * ldx : nullptr,
              m,
              ldx,
              w.tiles,
              w.scales,
              w.n,
              w.k,
              w.k_blocks,
              static_cast<char*>(y.data) + size_t(row0 * y.ld) * esize,
              y.dtype == DType::kBF16,
              y.ld,
              xf ? xf + row0 * ldx : nullptr};
  job.int8_tiles = w.int8;
  return job;
}

// Splits all (job, panel) items among the pool's threads in contiguous runs of roughly equal
// cost. A panel costs its rows of compute plus the streaming of its weights, which takes about
// as long as kStreamRows rows of dot products (the ridge point in docs/kernels-gemm.md).
// Rows of a gathered job copied together at a time (1024 x K BF16: 14 MB at V3's widest K).
constexpr int64_t kGatherRows = 1024;

void run_jobs(const std::vector<GemmJob>& jobs, PanelFn fn, ThreadPool* pool) {
  constexpr int64_t kStreamRows = 8;
  std::vector<int64_t> start(jobs.size() + 1, 0);  // cumulative cost before job j
  for (size_t j = 0; j < jobs.size(); ++j) {
    int64_t panels = (jobs[j].n + gemm_detail::kPanelCols - 1) / gemm_detail::kPanelCols;
    start[j + 1] = start[j] + panels * (jobs[j].m + kStreamRows);
  }
  const int64_t total = start.back();
  const int threads = pool ? pool->size() : 1;
  auto run_share = [&](int64_t t) {
    // Thread t takes the panels whose cost midpoint lies in [lo, hi).
    int64_t lo = total * t / threads, hi = total * (t + 1) / threads;
    for (size_t j = 0; j < jobs.size(); ++j) {
      int64_t c = jobs[j].m + kStreamRows;
      int64_t panels = (start[j + 1] - start[j]) / c;
      // Panel p's midpoint 2*start + (2p+1)*c over 2 within [lo, hi).
      auto first_at_or_after = [&](int64_t bound) {
        int64_t q = 2 * bound - 2 * start[j] - c;  // need (2p+1)c >= 2(bound-start) => p >= ...
        int64_t p = q <= 0 ? 0 : (q + 2 * c - 1) / (2 * c);
        return std::min(p, panels);
      };
      int64_t p0 = first_at_or_after(lo), p1 = first_at_or_after(hi);
      if (p0 >= p1) continue;
      if (!jobs[j].x_rows) {
        fn(jobs[j], p0, p1);
        continue;
      }
      // Gathered rows: this thread copies the job's rows together, kGatherRows at a time
      // (they stay in cache for all its panels; the copy stays bounded), and runs the plain
      // job on each copy. A row's result does not depend on the rows beside it, so the split
      // changes no bit.
      thread_local std::vector<uint16_t> gathered;
      const GemmJob& g = jobs[j];
      const size_t y_row_bytes = size_t(g.ldy) * (g.y_bf16 ? 2 : 4);
      for (int64_t r0 = 0; r0 < g.m; r0 += kGatherRows) {
        const int64_t rows = std::min(kGatherRows, g.m - r0);
        gathered.resize(size_t(rows * g.k));
        for (int64_t i = 0; i < rows; ++i) {
          std::memcpy(&gathered[size_t(i * g.k)], g.x + int64_t(g.x_rows[r0 + i]) * g.ldx,
                      size_t(g.k) * 2);
        }
        GemmJob copy = g;
        copy.x = gathered.data();
        copy.m = rows;
        copy.ldx = g.k;
        copy.x_rows = nullptr;
        copy.y = static_cast<char*>(g.y) + size_t(r0) * y_row_bytes;
        fn(copy, p0, p1);
      }
    }
  };
  if (threads == 1 || !pool) {
    run_share(0);
    return;
  }
  pool->parallel_for(threads, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) run_share(t);
  });
}

template <class Weight>
void dense(const uint16_t* x, const float* xf, int64_t m, int64_t ldx, const Weight& packed,
           GemmOutput y, ThreadPool* pool, PanelFn fn) {
  const JobWeight w = job_weight(packed);
  if (m <= 0) return;
  std::vector<GemmJob> jobs;
  // With fewer panels than threads, rows are split too (only small N). So are compute-bound
  // rows when the threads cannot share the panels evenly (V3's 2112-wide fused q_a/kv_a
  // projection has 33: one thread would do 17/16.5 of the average): each thread then takes
  // every panel for its rows, converting each tile once more (< 2% at 128 rows, where the
  // uneven share cost 3%).
  const int threads = pool ? pool->size() : 1;
  const int64_t panels = n_panels_of(w);
  int64_t row_chunks = 1;
  if (panels < threads) {
    row_chunks = std::clamp<int64_t>(m / 16, 1, threads);
  } else if (panels % threads != 0 && panels < 32 * threads && m >= 128 * threads) {
    row_chunks = threads;
  }
  for (int64_t c = 0; c < row_chunks; ++c) {
    int64_t r0 = m * c / row_chunks, r1 = m * (c + 1) / row_chunks;
    jobs.push_back(make_job(x, xf, r1 - r0, ldx, w, y, r0));
  }
  run_jobs(jobs, fn, pool);
}

// x_rows (BF16 x only; may be null): the gathered rows of gemm_fp8_grouped_contiguous_gather.
template <class Weight>
void grouped_contiguous(const uint16_t* x, const float* xf, int64_t ldx, const int32_t* x_rows,
                        const int64_t* offsets, const Weight* const* experts, int64_t n_experts,
                        GemmOutput y, ThreadPool* pool, PanelFn fn) {
  CHECK(n_experts >= 0 && (n_experts == 0 || offsets[0] == 0), "grouped: offsets must start at 0");
  std::vector<GemmJob> jobs;
  for (int64_t e = 0; e < n_experts; ++e) {
    int64_t rows = offsets[e + 1] - offsets[e];
    CHECK(rows >= 0, "grouped: offsets must not decrease");
    CHECK(experts[e]->n == experts[0]->n && experts[e]->k == experts[0]->k,
          "grouped: experts must share a shape");
    if (rows == 0) continue;
    GemmJob job = make_job(x, xf, rows, ldx, job_weight(*experts[e]), y, offsets[e]);
    if (x_rows) {  // the segment's rows are gathered from anywhere in x
      job.x = x;
      job.x_rows = x_rows + offsets[e];
    }
    jobs.push_back(job);
  }
  run_jobs(jobs, fn, pool);
}

template <class Weight>
void grouped_masked(const uint16_t* x, const float* xf, int64_t ldx, int64_t capacity,
                    const int32_t* counts, const Weight* const* experts, int64_t n_experts,
                    GemmOutput y, ThreadPool* pool, PanelFn fn) {
  std::vector<GemmJob> jobs;
  for (int64_t e = 0; e < n_experts; ++e) {
    CHECK(counts[e] >= 0 && counts[e] <= capacity, "masked: count outside [0, capacity]");
    CHECK(experts[e]->n == experts[0]->n && experts[e]->k == experts[0]->k,
          "masked: experts must share a shape");
    if (counts[e] > 0) {
      jobs.push_back(make_job(x, xf, counts[e], ldx, job_weight(*experts[e]), y, e * capacity));
    }
  }
  run_jobs(jobs, fn, pool);
}

}  // namespace

void gemm_fp8(const uint16_t* x, int64_t m, int64_t ldx, const PackedFp8Weight& w, GemmOutput y,
              ThreadPool* pool, Isa isa) {
  dense(x, nullptr, m, ldx, w, y, pool, panel_fn(isa));
}

void gemm_fp8_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                 const PackedFp8Weight* const* experts, int64_t n_experts,
                                 GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_contiguous(x, nullptr, ldx, nullptr, offsets, experts, n_experts, y, pool, panel_fn(isa));
}

void gemm_fp8_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                        const int64_t* offsets,
                                        const PackedFp8Weight* const* experts, int64_t n_experts,
                                        GemmOutput y, ThreadPool* pool, Isa isa) {
  CHECK(x_rows != nullptr, "grouped gather: x_rows is required");
  grouped_contiguous(x, nullptr, ldx, x_rows, offsets, experts, n_experts, y, pool, panel_fn(isa));
}

void gemm_fp8_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                             const int32_t* counts, const PackedFp8Weight* const* experts,
                             int64_t n_experts, GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_masked(x, nullptr, ldx, capacity, counts, experts, n_experts, y, pool, panel_fn(isa));
}

void gemm_bf16_packed(const uint16_t* x, int64_t m, int64_t ldx, const PackedBf16Weight& w,
                      float* y, int64_t ldy, ThreadPool* pool, Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "gemm_bf16_packed: ISA level above what this CPU supports");
  CHECK(ldx >= w.k && ldy >= w.n, "gemm_bf16_packed: row stride shorter than a row");
  if (m <= 0) return;
  GemmJob job{x,       m,     ldx, reinterpret_cast<const uint8_t*>(w.data.get()),
              nullptr, w.n,   w.k, w.k_blocks(),
              y,       false, ldy, nullptr,
              true};
  if (isa == Isa::kAmx || isa == Isa::kAvx512Bf16 || isa == Isa::kScalar) {
    run_jobs({job}, panel_fn(isa), pool);
    return;
  }
  // Without BF16 dot products: the F32-activation kernels on tiles converted exactly to F32
  // (X widened to F32 once; BF16 -> F32 is exact, so only the summation differs).
  std::vector<float> xf(size_t(m * w.k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < w.k; ++c) xf[size_t(i * w.k + c)] = bf16_to_f32(x[i * ldx + c]);
  job.x = nullptr;
  job.xf = xf.data();
  job.ldx = w.k;
  run_jobs({job}, panel_fn_f32x(isa), pool);
}

void gemm_fp8_f32x(const float* x, int64_t m, int64_t ldx, const PackedFp8Weight& w, GemmOutput y,
                   ThreadPool* pool, Isa isa) {
  dense(nullptr, x, m, ldx, w, y, pool, panel_fn_f32x(isa));
}

void gemm_fp8_f32x_grouped_contiguous(const float* x, int64_t ldx, const int64_t* offsets,
                                      const PackedFp8Weight* const* experts, int64_t n_experts,
                                      GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_contiguous(nullptr, x, ldx, nullptr, offsets, experts, n_experts, y, pool,
                     panel_fn_f32x(isa));
}

void gemm_fp8_f32x_grouped_masked(const float* x, int64_t ldx, int64_t capacity,
                                  const int32_t* counts, const PackedFp8Weight* const* experts,
                                  int64_t n_experts, GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_masked(nullptr, x, ldx, capacity, counts, experts, n_experts, y, pool,
                 panel_fn_f32x(isa));
}

void gemm_int8(const uint16_t* x, int64_t m, int64_t ldx, const PackedInt8Weight& w, GemmOutput y,
               ThreadPool* pool, Isa isa) {
  dense(x, nullptr, m, ldx, w, y, pool, panel_fn_int8(isa));
}

void gemm_int8_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                  const PackedInt8Weight* const* experts, int64_t n_experts,
                                  GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_contiguous(x, nullptr, ldx, nullptr, offsets, experts, n_experts, y, pool,
                     panel_fn_int8(isa));
}

void gemm_int8_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                         const int64_t* offsets,
                                         const PackedInt8Weight* const* experts, int64_t n_experts,
                                         GemmOutput y, ThreadPool* pool, Isa isa) {
  CHECK(x_rows != nullptr, "grouped gather: x_rows is required");
  grouped_contiguous(x, nullptr, ldx, x_rows, offsets, experts, n_experts, y, pool,
                     panel_fn_int8(isa));
}

void gemm_int8_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                              const int32_t* counts, const PackedInt8Weight* const* experts,
                              int64_t n_experts, GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_masked(x, nullptr, ldx, capacity, counts, experts, n_experts, y, pool,
                 panel_fn_int8(isa));
}

void gemm_int4(const uint16_t* x, int64_t m, int64_t ldx, const PackedInt4Weight& w, GemmOutput y,
               ThreadPool* pool, Isa isa) {
  dense(x, nullptr, m, ldx, w, y, pool, panel_fn_int4(isa));
}

void gemm_int4_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                  const PackedInt4Weight* const* experts, int64_t n_experts,
                                  GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_contiguous(x, nullptr, ldx, nullptr, offsets, experts, n_experts, y, pool,
                     panel_fn_int4(isa));
}

void gemm_int4_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                         const int64_t* offsets,
                                         const PackedInt4Weight* const* experts, int64_t n_experts,
                                         GemmOutput y, ThreadPool* pool, Isa isa) {
  CHECK(x_rows != nullptr, "grouped gather: x_rows is required");
  grouped_contiguous(x, nullptr, ldx, x_rows, offsets, experts, n_experts, y, pool,
                     panel_fn_int4(isa));
}

void gemm_int4_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                              const int32_t* counts, const PackedInt4Weight* const* experts,
                              int64_t n_experts, GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_masked(x, nullptr, ldx, capacity, counts, experts, n_experts, y, pool,
                 panel_fn_int4(isa));
}

void gemm_fp4(const uint16_t* x, int64_t m, int64_t ldx, const PackedFp4Weight& w, GemmOutput y,
              ThreadPool* pool, Isa isa) {
  dense(x, nullptr, m, ldx, w, y, pool, panel_fn_fp4(isa));
}

void gemm_fp4_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                 const PackedFp4Weight* const* experts, int64_t n_experts,
                                 GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_contiguous(x, nullptr, ldx, nullptr, offsets, experts, n_experts, y, pool,
                     panel_fn_fp4(isa));
}

void gemm_fp4_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                        const int64_t* offsets,
                                        const PackedFp4Weight* const* experts, int64_t n_experts,
                                        GemmOutput y, ThreadPool* pool, Isa isa) {
  CHECK(x_rows != nullptr, "grouped gather: x_rows is required");
  grouped_contiguous(x, nullptr, ldx, x_rows, offsets, experts, n_experts, y, pool,
                     panel_fn_fp4(isa));
}

void gemm_fp4_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                             const int32_t* counts, const PackedFp4Weight* const* experts,
                             int64_t n_experts, GemmOutput y, ThreadPool* pool, Isa isa) {
  grouped_masked(x, nullptr, ldx, capacity, counts, experts, n_experts, y, pool, panel_fn_fp4(isa));
}

}  // namespace moeserve
