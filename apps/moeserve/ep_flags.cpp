#include "ep_flags.h"

#include <algorithm>
#include <chrono>

#include "eplb/expert_loads.h"

namespace moeserve::cli {

bool EpFlags::enabled() const {
  return ep || launched_by_mpirun();
}

void add_ep_flags(CLI::App& app, EpFlags& f) {
  app.add_flag("--ep", f.ep, "Expert parallelism over MPI (default when started by mpirun)");
  app.add_flag("--no-overlap", f.no_overlap,
               "Expert parallelism: one batch per step, no dual micro-batch overlap of "
               "communication and compute (same flag on every rank)");
  app.add_option("--overlap-min-tokens", f.overlap_min_tokens,
                 "Expert parallelism: a rank splits a step into two micro-batches only from this "
                 "many new tokens (-1: automatic, 2*9*experts/(ranks*top_k); 0: always)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 40))
      ->capture_default_str();
  app.add_option("--dispatch-dtype", f.dispatch_dtype,
                 "EP dispatch payload: fp8 | bf16 | f32 (lossless, for checking)")
      ->check(CLI::IsMember({"fp8", "bf16", "f32"}))
      ->capture_default_str();
  app.add_option("--ep-mode", f.ep_mode, "EP exchange: normal | low-latency")
      ->check(CLI::IsMember({"normal", "low-latency"}))
      ->capture_default_str();
  app.add_option("--ep-timeout", f.ep_timeout_s, "Seconds to wait for a silent EP peer")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--expert-stats-out", f.expert_stats_out,
                 "Write the group's tokens per expert and MoE layer at the end (input of "
                 "`moeserve eplb --loads` and --eplb-init); needs expert parallelism");
  app.add_option("--eplb-init", f.eplb_init,
                 "Place experts by the EPLB plan of these loads (stats file or JSON matrix)");
  app.add_option("--redundant-experts", f.redundant_experts,
                 "EPLB: extra expert slots per MoE layer (experts + N must divide by the ranks)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--eplb-groups", f.eplb_groups, "EPLB expert groups (default: n_group)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eplb-nodes", f.eplb_nodes, "EPLB: nodes the ranks span")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--eplb-window", f.eplb_window, "EPLB: steps in the load moving window")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--eplb-interval", f.eplb_interval,
                 "EPLB: re-plan from the load window every N steps and migrate the changed "
                 "experts' weights between ranks in the background (0 = never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--eplb-migrate-mb", f.eplb_migrate_mb,
                 "EPLB: MiB of expert weights each rank sends per step while migrating")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

std::string check_ep_flags(const EpFlags& f) {
  if (f.eplb() && !f.enabled()) {
    return "--expert-stats-out, --eplb-init and --eplb-interval need expert parallelism "
           "(mpirun, or --ep for one process)";
  }
  if (f.redundant_experts > 0 && f.eplb_init.empty() && f.eplb_interval == 0) {
    return "--redundant-experts needs --eplb-init or --eplb-interval (the loads to plan from)";
  }
  return "";
}

Result<EpGroup> join_ep_group(const EpFlags& f, const ModelConfig& c, int64_t max_tokens_per_rank,
                              bool bf16_rows, bool mtp) {
  EpGroupOptions eo;
  eo.dtype = *dispatch_dtype_from_name(f.dispatch_dtype);
  eo.mode = *ep_mode_from_name(f.ep_mode);
  eo.timeout = std::chrono::milliseconds(int64_t(f.ep_timeout_s * 1000));
  eo.max_tokens_per_rank = max_tokens_per_rank;
  eo.bf16_rows = bf16_rows;
  eo.count_loads = f.eplb();
  eo.moe_layers =
      int32_t(c.num_moe_layers()) + (mtp && c.is_moe_layer(c.num_hidden_layers) ? 1 : 0);
  eo.eplb.redundant_experts = f.redundant_experts;
  eo.eplb.groups = f.eplb_groups > 0 ? f.eplb_groups : int32_t(c.n_group);
  eo.eplb.nodes = f.eplb_nodes;
  eo.eplb.window_steps = f.eplb_window;
  eo.eplb.interval_steps = f.eplb_interval;
  eo.eplb.migrate_bytes_per_step = std::max<int64_t>(1, int64_t(f.eplb_migrate_mb * (1 << 20)));
  eo.eplb.log_migrations = true;
  if (!f.eplb_init.empty()) {
    auto file = eplb::read_load_file(f.eplb_init);
    if (!file.ok()) return file.status().with_context("--eplb-init");
    eo.eplb_loads = std::move(file->loads);
  }
  return join_mpi_ep_group(eo, c.n_routed_experts, c.hidden_size, c.num_experts_per_tok);
}

}  // namespace moeserve::cli
