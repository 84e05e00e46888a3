// The baseline: oneDNN's BF16 matmul Y[M, N] (F32) = X[M, K] (BF16) * W^T, W [N, K] BF16, with
// W reordered once into oneDNN's preferred blocked layout (as gemm_fp8 packs once at load).
// Bench-only; one object per (M, N, K); run() from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

namespace moeserve::bench {

class OneDnnMatmul {
 public:
  OneDnnMatmul(int64_t m, int64_t n, int64_t k);
  ~OneDnnMatmul();
  OneDnnMatmul(const OneDnnMatmul&) = delete;
  OneDnnMatmul& operator=(const OneDnnMatmul&) = delete;

  // Adds one weight copy from w [n, k] BF16 bits (reordered; the caller's buffer is not kept).
  void add_weight(const uint16_t* w);
  int copies() const;
  // y = x * W(copy)^T; x [m, k] BF16, y [m, n] F32, both dense.
  void run(int copy, const uint16_t* x, float* y);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sets the OpenMP thread count oneDNN uses (no-op without OpenMP).
void set_onednn_threads(int threads);

}  // namespace moeserve::bench
