#include "kernels/cpu_features.h"

#include <cstdio>
#include <cstdlib>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace moeserve {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
    if (name == isa_name(i)) return i;
  }
  return std::nullopt;
}

// Linux hands a process the AMX tile state (8 KB of registers per thread) only on request; the
// grant covers every thread of the process, later ones included.
static bool os_grants_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

static Isa detect() {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  // The BF16 level also byte-shuffles (VBMI: the FP8 -> BF16 lookups) and runs INT8 dot products
  // (VNNI: gemm_int8); every CPU with BF16 dot products except Cooper Lake has both.
  bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16") &&
              __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni");
  const bool amx = bf16 && __builtin_cpu_supports("amx-tile") &&
                   __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-int8");
  if (amx && os_grants_amx()) return Isa::kAmx;
  if (bf16) return Isa::kAvx512Bf16;
  if (avx512) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa cpu_isa() {
  static const Isa isa = detect();
  return isa;
}

static Isa pick_active() {
  const Isa cpu = cpu_isa();
  const Isa dflt = cpu;
  const char* env = std::getenv("MOESERVE_ISA");
  if (!env || !*env) return dflt;
  std::optional<Isa> want = isa_from_name(env);
  if (!want) {
    std::fprintf(stderr,
                 "moeserve: ignoring MOESERVE_ISA=%s (use scalar|avx2|avx512|avx512bf16|amx)\n",
                 env);
    return dflt;
  }
  return isa_at_most(*want, cpu) ? *want : cpu;
}

Isa active_isa() {
  static const Isa isa = pick_active();
  return isa;
}

Isa active_int8_isa() {
  static const Isa isa = [] {
    const char* env = std::getenv("MOESERVE_ISA");
    return env && *env ? active_isa() : cpu_isa();
  }();
  return isa;
}

}  // namespace moeserve
