// Run-time instruction-set selection for the SIMD kernels.
//
// Kernels come in levels: a scalar reference, AVX2+FMA, AVX-512 (F/BW/VL/DQ) and AVX-512 with
// BF16 dot products, VBMI byte shuffles and VNNI INT8 dot products (every BF16-capable CPU but
// Cooper Lake has all three), and
// on top of that Intel's AMX tile unit (TDPBF16PS/TDPBSSD, Sapphire Rapids on;
// docs/kernels-amx.md). kAmx is a superset of kAvx512Bf16: kernels without an AMX form run their
// AVX-512 BF16 code there. cpu_isa() is the best level this CPU runs (checked once with
// __builtin_cpu_supports; AMX also needs Linux to grant the tile state,
// arch_prctl(ARCH_REQ_XCOMP_PERM)); active_isa() is the level the program runs: cpu_isa(),
// lowered (or raised back) by the environment variable
// MOESERVE_ISA=scalar|avx2|avx512|avx512bf16|amx when set (a request above what the CPU supports is
// clamped to cpu_isa()). Both are computed once and never change, so any thread may call them.
//
// Code compiled with -mavx512*/-mavx2/-mamx* (files named *_avx512.cpp, *_avx512f.cpp, *_avx2.cpp,
// *_amx.cpp) runs
// only behind these checks. Those files keep their code in anonymous namespaces and avoid
// inline/template code shared with other files: the linker may keep any one copy of an inline
// function, and an AVX-512 copy must never be the one a baseline caller gets.
#pragma once

#include <optional>
#include <string_view>

namespace moeserve {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

const char* isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);

Isa cpu_isa();
Isa active_isa();
// The level gemm_int8 runs by default: cpu_isa() (AMX included, not opt-in: its INT8 levels give
// the same bits and the AMX one runs few-row calls on VNNI, so nothing gets slower), or
// active_isa() when MOESERVE_ISA is set.
Isa active_int8_isa();

// Levels from kScalar up to cpu_isa(), lowest first (what tests iterate over).
inline bool isa_at_most(Isa a, Isa b) {
  return int(a) <= int(b);
}

}  // namespace moeserve
