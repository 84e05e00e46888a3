// Load per GPU (EP rank) before and after balancing, the figures `moeserve eplb` reports
// (docs/eplb.md, "Before and after").
//   before: no redundant experts; the E logical experts sit contiguously on the G GPUs, expert
//           e on GPU floor(e * G / E) (E / G experts per GPU when G divides E), the layout of
//           expert parallelism without EPLB.
//   after:  the placement's slots; a logical expert's load is split evenly among its replicas
//           (what replica_router.h's dispatch achieves when tokens come evenly from all ranks).
// Pure functions, callable from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "eplb/expert_loads.h"
#include "eplb/placement.h"

namespace moeserve::eplb {

struct LoadBalance {
  double max = 0;   // load of the busiest GPU
  double mean = 0;  // total load / GPUs (the same before and after)
  // max / mean (1 is perfect balance); 1 when there is no load at all.
  double imbalance() const { return mean > 0 ? max / mean : 1.0; }
};

// [num_gpus] loads of one layer without replicas.
std::vector<double> gpu_loads_before(const ExpertLoads& loads, int32_t layer, int32_t num_gpus);
// [num_gpus] loads of one layer under `placement`; loads and placement must agree in shape.
std::vector<double> gpu_loads_after(const ExpertLoads& loads, const Placement& placement,
                                    int32_t layer);
LoadBalance summarize(const std::vector<double>& gpu_loads);

}  // namespace moeserve::eplb
