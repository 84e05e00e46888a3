// A device with round numbers for the sim's hand-computed tests: every efficiency 1 but the
// GEMMs' (0.5), so that expected times are FLOPs or bytes over a round rate.
#pragma once

#include "sim/hardware.h"

namespace moeserve::sim {

inline DeviceSpec plain_device() {
  DeviceSpec d;
  d.name = "test";
  d.fp8_flops = 2000e12;
  d.bf16_flops = 1000e12;
  d.mem_bw = 3000e9;
  d.mem_bytes = 80e9;
  d.gemm_compute_eff = 0.5;
  d.mem_bw_eff = 1.0;
  return d;
}

}  // namespace moeserve::sim
