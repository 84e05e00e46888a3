// The expert-parallel and EPLB flags that `generate` and `serve` share, their checks, and the EP
// group they make (docs/ep-serving.md, docs/eplb.md).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "ep/ep_group.h"
#include "model/config.h"

namespace moeserve::cli {

struct EpFlags {
  bool ep = false;  // expert parallelism without mpirun (a group of one)
  std::string dispatch_dtype = "fp8";
  std::string ep_mode = "normal";
  double ep_timeout_s = 30;
  bool no_overlap = false;          // one batch per step instead of two overlapped micro-batches
  int64_t overlap_min_tokens = -1;  // split a step only from this many new tokens (-1: auto)
  std::string expert_stats_out;     // write the group's expert loads (stats format) at the end
  std::string eplb_init;            // plan the placement from these loads
  int32_t redundant_experts = 0;
  int32_t eplb_groups = 0;  // 0: the model's n_group
  int32_t eplb_nodes = 1;
  int32_t eplb_window = 1000;
  int64_t eplb_interval = 0;    // online rebalancing every this many steps (0: off)
  double eplb_migrate_mb = 16;  // expert bytes each rank sends per step while migrating

  // Under mpirun or with --ep.
  bool enabled() const;
  // Some EPLB flag asks for load counting.
  bool eplb() const { return !expert_stats_out.empty() || !eplb_init.empty() || eplb_interval > 0; }
};

void add_ep_flags(CLI::App& app, EpFlags& flags);

// Flag combinations that make no sense: a message for a usage error (exit 2), or "".
std::string check_ep_flags(const EpFlags& flags);

// Joins the MPI world as an EP group for this model. max_tokens_per_rank sizes the low-latency
// buffers; bf16_rows: the experts read BF16 inputs (the fast path); mtp: the MTP module's MoE
// layer is dispatched too, as the last MoE layer (docs/mtp.md).
Result<EpGroup> join_ep_group(const EpFlags& flags, const ModelConfig& config,
                              int64_t max_tokens_per_rank, bool bf16_rows, bool mtp = false);

}  // namespace moeserve::cli
