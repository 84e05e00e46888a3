#include "eplb/gpu_load.h"

#include <algorithm>

#include "core/check.h"

namespace moeserve::eplb {

std::vector<double> gpu_loads_before(const ExpertLoads& loads, int32_t layer, int32_t num_gpus) {
  CHECK(num_gpus >= 1, "at least one GPU");
  std::vector<double> out(num_gpus, 0.0);
  const int64_t E = loads.num_experts;
  for (int64_t e = 0; e < E; ++e) out[e * num_gpus / E] += loads.at(layer, int32_t(e));
  return out;
}

std::vector<double> gpu_loads_after(const ExpertLoads& loads, const Placement& placement,
                                    int32_t layer) {
  CHECK(loads.num_layers == placement.num_layers() && loads.num_experts == placement.num_logical(),
        "loads and placement have the same shape");
  std::vector<double> out(placement.num_gpus(), 0.0);
  for (int32_t s = 0; s < placement.num_physical(); ++s) {
    const int32_t e = placement.phy2log(layer, s);
    out[placement.gpu_of_slot(s)] += loads.at(layer, e) / placement.logcnt(layer, e);
  }
  return out;
}

LoadBalance summarize(const std::vector<double>& gpu_loads) {
  LoadBalance b;
  if (gpu_loads.empty()) return b;
  double total = 0;
  for (double v : gpu_loads) total += v;
  b.max = *std::max_element(gpu_loads.begin(), gpu_loads.end());
  b.mean = total / static_cast<double>(gpu_loads.size());
  return b;
}

}  // namespace moeserve::eplb
