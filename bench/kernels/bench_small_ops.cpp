#include "bench_small_ops.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace moeserve::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call: the best of three rounds of at least min_s each.
double time_call(const std::function<void()>& fn, double min_s) {
  fn();  // warm up (page faults, caches)
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    int64_t calls = 0;
    const double t0 = now_s();
    double t = 0;
    do {
      fn();
      ++calls;
      t = now_s() - t0;
    } while (t < min_s);
    best = std::min(best, t / double(calls));
  }
  return best;
}

std::vector<float> random_floats(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void report(const SmallOpsBenchOptions& opt, const Ceilings& ceil, const std::string& kernel,
            const std::string& shape, double bytes, double t, double t_base) {
  const double gbps = bytes / t / 1e9;
  if (opt.json) {
    nlohmann::json j = {{"kernel", kernel},
                        {"shape", shape},
                        {"gbps", gbps},
                        {"dram_ratio", gbps / ceil.dram_read_gbps},
                        {"baseline_ratio", t_base / t},
                        {"baseline", "scalar reference"},
                        {"seconds", t},
                        {"baseline_seconds", t_base},
                        {"dram_read_gbps", ceil.dram_read_gbps},
                        {"isa", isa_name(active_isa())}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{:<14} {:<22} {:>10.2f} {:>8.1f} {:>6.2f} {:>6.1f}\n", kernel, shape, t * 1e6, gbps,
               gbps / ceil.dram_read_gbps, t_base / t);
  }
  std::fflush(stdout);
}

}  // namespace

void run_small_ops_benches(const SmallOpsBenchOptions& opt, const Ceilings& ceil) {
  const double min_s = opt.quick ? 0.05 : 0.2;
  if (!opt.json) {
    fmt::print("{:<14} {:<22} {:>10} {:>8} {:>6} {:>6}\n", "kernel", "shape", "us/call", "GB/s",
               "dram", "base");
  }
  for (int64_t hidden : {2048, 7168}) {
    for (int64_t rows : {32, 1024}) {  // rmsnorm: [rows, hidden] F32 in, F32 out, in place
      std::vector<float> x = random_floats(size_t(rows * hidden), 1.0f, 1);
      std::vector<float> w = random_floats(size_t(hidden), 1.0f, 2), y(x.size());
      const double t = time_call(
          [&] { rmsnorm(x.data(), rows, hidden, hidden, w.data(), 1e-6f, y.data(), hidden); },
          min_s);
      const double t_base = time_call(
          [&] { rmsnorm_ref(x.data(), rows, hidden, hidden, w.data(), 1e-6f, y.data(), hidden); },
          min_s);
      report(opt, ceil, "rmsnorm", fmt::format("{}x{}", rows, hidden), 8.0 * double(x.size()), t,
             t_base);
    }
  }
  RopeParams p;  // DeepSeek-V3: 64 rotary dims, YaRN factor 40
  p.dim = 64;
  p.yarn = true;
  p.factor = 40.0;
  p.original_max_position_embeddings = 4096;
  const RopeTable rope(p);
  for (int64_t heads : {16, 128}) {  // one token's q_pe (heads rows of stride 192) and k_pe
    const int64_t tokens = 32, ld = 192;
    std::vector<float> q = random_floats(size_t(tokens * heads * ld), 1.0f, 3);
    std::vector<float> k = random_floats(size_t(tokens * 576), 1.0f, 4);
    auto run = [&](bool fast) {
      for (int64_t t = 0; t < tokens; ++t) {
        float* qt = &q[size_t(t * heads * ld + 128)];
        float* kt = &k[size_t(t * 576 + 512)];
        fast ? rope.apply_fast(qt, heads, ld, 1000 + t) : rope.apply(qt, heads, ld, 1000 + t);
        fast ? rope.apply_fast(kt, 1, 576, 1000 + t) : rope.apply(kt, 1, 576, 1000 + t);
      }
    };
    const double t = time_call([&] { run(true); }, min_s);
    const double t_base = time_call([&] { run(false); }, min_s);
    report(opt, ceil, "rope", fmt::format("{} tokens x {} heads", tokens, heads),
           8.0 * 64 * double(tokens * (heads + 1)), t, t_base);
  }
  for (int64_t n : {int64_t(256) * 512, int64_t(256) * 2048, int64_t(8192) * 2048}) {
    if (opt.quick && n > 256 * 2048) continue;
    // silu_mul: g, u [n] F32 (a step's expert rows x intermediate) -> BF16 and F32
    std::vector<float> g = random_floats(size_t(n), 4.0f, 5), u = random_floats(size_t(n), 1.0f, 6);
    std::vector<float> out(static_cast<size_t>(n));
    std::vector<uint16_t> out_b(static_cast<size_t>(n));
    double t = time_call([&] { silu_mul_bf16(g.data(), u.data(), n, out_b.data()); }, min_s);
    double t_base =
        time_call([&] { silu_mul_bf16_ref(g.data(), u.data(), n, out_b.data()); }, min_s);
    report(opt, ceil, "silu_mul_bf16", fmt::format("{}", n), 10.0 * double(n), t, t_base);
    t = time_call([&] { silu_mul(g.data(), u.data(), n, out.data()); }, min_s);
    t_base = time_call([&] { silu_mul_ref(g.data(), u.data(), n, out.data()); }, min_s);
    report(opt, ceil, "silu_mul", fmt::format("{}", n), 12.0 * double(n), t, t_base);
  }
}

}  // namespace moeserve::bench
