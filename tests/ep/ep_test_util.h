// Shared by the EP unit tests (threads) and the mpirun tests: random routed tokens, a
// row-by-row expert function, and an emulation of the wire numerics written independently of
// EpDispatcher (BF16 or FP8 1x128 payload, BF16 combine rows, gate-weighted sum by expert id).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "ep/dispatcher.h"
#include "ep/ep_dispatcher.h"
#include "ep/wire_format.h"
#include "kernels/quant.h"

namespace moeserve::ep_testing {

constexpr int64_t H = 200;  // two 1x128 groups, the second partial
constexpr int64_t K = 4;
constexpr int64_t E = 16;

struct Tokens {
  int64_t n = 0;
  std::vector<float> x;      // [n, H]
  std::vector<int32_t> ids;  // [n, K] distinct experts per token
  std::vector<float> w;      // [n, K]
};

inline Tokens random_tokens(int64_t n, uint32_t seed, const std::function<bool(int32_t)>& allowed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unif(0.05f, 1.0f);
  std::vector<int32_t> pool;
  for (int32_t e = 0; e < E; ++e) {
    if (allowed(e)) pool.push_back(e);
  }
  Tokens t;
  t.n = n;
  for (int64_t i = 0; i < n * H; ++i) t.x.push_back(normal(rng) * (i % 97 == 0 ? 20.0f : 1.0f));
  for (int64_t i = 0; i < n; ++i) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < K; ++j) {
      t.ids.push_back(pool[size_t(j)]);
      t.w.push_back(unif(rng));
    }
  }
  return t;
}

inline bool any_expert(int32_t) {
  return true;
}

// A different nonlinear function per expert, row by row (so batching cannot change a row).
inline void expert_fn(int32_t e, const float* x, float* out) {
  for (int64_t c = 0; c < H; ++c) {
    out[c] = std::tanh(x[c] * (0.3f + 0.05f * float(e))) + 0.01f * float(e) * float(c % 7);
  }
}

inline std::vector<float> run_experts(const ExpertBatch& b) {
  std::vector<float> out(size_t(b.n_rows() * H), 0.0f);  // [n_rows, H]
  for (size_t s = 0; s < b.experts.size(); ++s) {
    for (int64_t r = b.segment_begin(s); r < b.segment_begin(s) + b.segment_rows(s); ++r) {
      expert_fn(b.experts[s], &b.x[size_t(r * H)], &out[size_t(r * H)]);
    }
  }
  return out;
}

inline Result<std::vector<float>> moe_step(Dispatcher& d, const Tokens& t) {
  ASSIGN_OR_RETURN(ExpertBatch b, d.dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K));
  std::vector<float> out = run_experts(b);
  std::vector<float> y(size_t(t.n * H), -1.0f);  // [n, H]
  RETURN_IF_ERROR(d.combine(b, out.data(), y.data()));
  return y;
}

// What the wire does to one token row, written independently of EpDispatcher.
inline std::vector<float> wire_row(const float* x, DispatchDType dt) {
  if (dt == DispatchDType::kF32) return std::vector<float>(x, x + H);
  std::vector<uint16_t> b(static_cast<size_t>(H));
  for (int64_t c = 0; c < H; ++c) b[size_t(c)] = f32_to_bf16(x[c]);
  std::vector<float> r(static_cast<size_t>(H));
  if (dt == DispatchDType::kBf16) {
    for (int64_t c = 0; c < H; ++c) r[size_t(c)] = bf16_to_f32(b[size_t(c)]);
    return r;
  }
  std::vector<uint8_t> q(static_cast<size_t>(H));
  float scales[2];
  quantize_fp8_1x128_ref(b.data(), 1, H, H, q.data(), H, scales);
  for (int64_t c = 0; c < H; ++c) r[size_t(c)] = fp8e4m3_to_f32(q[size_t(c)]) * scales[c / 128];
  return r;
}

inline std::vector<float> emulate(const Tokens& t, DispatchDType dt) {
  std::vector<float> y(size_t(t.n * H), 0.0f), out(static_cast<size_t>(H));
  for (int64_t i = 0; i < t.n; ++i) {
    std::vector<float> xr = wire_row(&t.x[size_t(i * H)], dt);
    // LocalDispatcher's order: by ascending expert id.
    std::vector<int64_t> order(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j) order[size_t(j)] = j;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return t.ids[size_t(i * K + a)] < t.ids[size_t(i * K + b)];
    });
    for (int64_t j : order) {
      expert_fn(t.ids[size_t(i * K + j)], xr.data(), out.data());
      for (int64_t c = 0; c < H; ++c) {
        float o =
            dt == DispatchDType::kF32 ? out[size_t(c)] : bf16_to_f32(f32_to_bf16(out[size_t(c)]));
        y[size_t(i * H + c)] += t.w[size_t(i * K + j)] * o;
      }
    }
  }
  return y;
}

// |ep - local| allowed per element: payload rounding through expert_fn (Lipschitz <= 1.05)
// plus BF16 rounding of the expert output (|out| < 2), weighted by the gates.
inline float tolerance(const Tokens& t, int64_t i, int64_t c, DispatchDType dt) {
  float wsum = 0.0f;
  for (int64_t j = 0; j < K; ++j) wsum += t.w[size_t(i * K + j)];
  const float xc = std::fabs(t.x[size_t(i * H + c)]);
  if (dt == DispatchDType::kF32) return 0.0f;  // lossless, and LocalDispatcher's order
  float dx = 0x1p-9f * xc;                     // BF16
  if (dt == DispatchDType::kFp8) {
    float amax = 0.0f;
    int64_t g0 = c / 128 * 128, g1 = std::min(H, g0 + 128);
    for (int64_t k = g0; k < g1; ++k) amax = std::max(amax, std::fabs(t.x[size_t(i * H + k)]));
    dx += 0x1p-4f * xc + amax / 448.0f * 0x1p-10f;  // e4m3 half ulp, subnormal half step
  }
  return wsum * (1.1f * dx + 2.0f * 0x1p-8f) + 1e-6f;
}

// y must equal the emulation bit for bit, and LocalDispatcher's within the payload tolerance.
inline void expect_matches(const Tokens& t, const std::vector<float>& y, DispatchDType dt,
                           const std::string& what) {
  std::vector<float> exact = emulate(t, dt);
  LocalDispatcher local(E);
  auto ref = moe_step(local, t);
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(y.size(), exact.size()) << what;
  int64_t bad_exact = 0, bad_tol = 0;
  for (int64_t i = 0; i < t.n; ++i) {
    for (int64_t c = 0; c < H; ++c) {
      size_t k = size_t(i * H + c);
      bad_exact += y[k] != exact[k];
      bad_tol += std::fabs(y[k] - (*ref)[k]) > tolerance(t, i, c, dt);
    }
  }
  EXPECT_EQ(bad_exact, 0) << what << ": elements differing from the wire emulation";
  EXPECT_EQ(bad_tol, 0) << what << ": elements beyond the payload tolerance of LocalDispatcher";
}

// Every rank of `group` (one thread each) dispatches tokens(rank) twice with options `o`: once
// with F32 rows and once with BF16 rows (EpOptions::bf16_rows). Per rank the two batches, or in
// status the first error.
struct BothRowKinds {
  std::vector<ExpertBatch> f32, bf16;
  std::vector<Status> status;
};
inline BothRowKinds dispatch_both_row_kinds(std::vector<std::unique_ptr<Communicator>>& group,
                                            const ExpertPlacement& placement, EpOptions o,
                                            const std::function<Tokens(int)>& tokens) {
  const size_t R = group.size();
  BothRowKinds out{std::vector<ExpertBatch>(R), std::vector<ExpertBatch>(R),
                   std::vector<Status>(R)};
  std::vector<std::thread> threads;
  for (size_t r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      Tokens t = tokens(int(r));
      for (bool rows16 : {false, true}) {
        EpOptions opt = o;  // (o is shared by the threads)
        opt.bf16_rows = rows16;
        auto d = EpDispatcher::create(*group[r], placement, opt);
        if (!d.ok()) {
          out.status[r] = d.status();
          return;
        }
        auto b = (*d)->dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
        if (!b.ok()) {
          out.status[r] = b.status();
          return;
        }
        (rows16 ? out.bf16 : out.f32)[r] = std::move(*b);
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Rows in use of b (BF16 rows) whose values are not the BF16 rounding of a's F32 rows (two
// dispatches of the same tokens, same layout), counted per element.
inline int64_t bf16_row_mismatches(const ExpertBatch& a, const ExpertBatch& b) {
  int64_t bad = 0;
  for (size_t s = 0; s < a.experts.size(); ++s) {
    for (int64_t r = a.segment_begin(s); r < a.segment_begin(s) + a.segment_rows(s); ++r) {
      const uint16_t* got = b.bf16_row(r);
      for (int64_t c = 0; c < H; ++c) bad += got[c] != f32_to_bf16(a.x[size_t(r * H + c)]);
    }
  }
  return bad;
}

}  // namespace moeserve::ep_testing
