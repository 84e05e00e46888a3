// moeserve-bench: kernel benchmarks (not part of the moeserve binary; links oneDNN).
//   moeserve-bench kernels [--json] [--quick] [--threads N]
// Each run measures the machine's ceilings first, then prints one line per case.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_dsa.h"
#include "bench_mla.h"
#include "bench_small_ops.h"
#include "bench_v4.h"
#include "core/thread_pool.h"
#include "e2e_bench.h"
#include "gemm_bench.h"
#include "kernels/cpu_features.h"
#include "machine.h"
#include "moeserve/format_flags.h"

int main(int argc, char** argv) {
  using namespace moeserve;
  CLI::App app{"moeserve-bench: kernel benchmarks against the machine's ceilings and oneDNN"};
  app.require_subcommand(1);
  CLI::App* kernels = app.add_subcommand("kernels", "FP8 GEMM (and other kernel) benchmarks");
  bool json = false, quick = false;
  int threads = 2;
  kernels->add_flag("--json", json, "one JSON object per line and case");
  kernels->add_flag("--quick", quick, "a short subset of the cases");
  bool dsa_decode_only = false;
  kernels->add_flag("--dsa-decode-only", dsa_decode_only, "dsa: the decode cases only");
  std::string only;
  kernels->add_option("--only", only,
                      "run only the kernels whose name starts with this (gemm_bf16, gemm_fp8, "
                      "gemm_int8, gemm_int4, gemm_fp4, mla, small_ops, dsa)");
  kernels->add_option("--threads", threads, "threads for kernels and baseline")
      ->check(CLI::Range(1, 1024));
  CLI::App* e2e = app.add_subcommand("e2e", "Batch-1 decode tokens/s against the roofline");
  bench::E2eOptions e2e_options;
  e2e->add_option("--model", e2e_options.model_dir, "checkpoint directory")->required();
  e2e->add_flag("--json", e2e_options.json, "one JSON object");
  e2e->add_option("--decode-tokens", e2e_options.decode_tokens, "tokens to time");
  cli::add_format_flags(*e2e, e2e_options.formats);
  e2e->add_option("--threads", threads, "threads")->check(CLI::Range(1, 1024));
  CLI::App* v4 = app.add_subcommand(
      "v4", "DeepSeek-V4 decode at long contexts and prefill against the roofline");
  bench::V4BenchOptions v4_options;
  v4->add_option("--model", v4_options.model_dir, "checkpoint (make-model --preset v4-flash-bench)")
      ->required();
  v4->add_flag("--json", v4_options.json, "one JSON object");
  v4->add_option("--contexts", v4_options.contexts, "decode contexts")->delimiter(',');
  v4->add_option("--prefill", v4_options.prefill, "prefill lengths (0: none)")->delimiter(',');
  v4->add_option("--batches", v4_options.batches, "batched decode sizes (0: none)")->delimiter(',');
  v4->add_option("--batch-context", v4_options.batch_context, "context of each batched sequence");
  v4->add_option("--repeats", v4_options.repeats, "timed decode steps per context (best)");
  cli::add_format_flags(*v4, v4_options.formats);
  v4->add_option("--threads", threads, "threads")->check(CLI::Range(1, 1024));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  ThreadPool pool(threads);
  bench::Ceilings ceil = bench::measure_ceilings(pool);
  if (e2e->parsed()) return bench::run_e2e_bench(e2e_options, ceil, pool);
  if (v4->parsed()) return bench::run_v4_bench(v4_options, ceil, pool);
  if (!json) {
    fmt::print("isa {}  threads {}  DRAM read {:.1f} GB/s  BF16 peak {:.1f} GFLOP/s",
               isa_name(active_isa()), threads, ceil.dram_read_gbps, ceil.bf16_peak_gflops);
    if (ceil.vnni_peak_gops > 0) fmt::print("  VNNI INT8 peak {:.1f} GOP/s", ceil.vnni_peak_gops);
    if (ceil.amx_bf16_peak_gflops > 0) {
      fmt::print("  AMX BF16 peak {:.1f} GFLOP/s  AMX INT8 peak {:.1f} GOP/s",
                 ceil.amx_bf16_peak_gflops, ceil.amx_int8_peak_gops);
    }
    fmt::print("\n");
  }
  bench::run_gemm_benches(bench::GemmBenchOptions{json, quick, only}, ceil, pool);
  if (std::string("mla_decode").rfind(only, 0) == 0)
    bench::run_mla_benches(bench::MlaBenchOptions{json, quick}, ceil, pool);
  if (std::string("small_ops").rfind(only, 0) == 0)
    bench::run_small_ops_benches(bench::SmallOpsBenchOptions{json, quick}, ceil);
  // DSA against dense MLA at V3.2's widths: long (minutes at 128k), so only when asked for.
  if (only == "dsa")
    bench::run_dsa_benches(bench::DsaBenchOptions{json, quick, dsa_decode_only}, ceil, pool);
  return 0;
}
