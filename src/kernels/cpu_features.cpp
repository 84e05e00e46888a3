#include "kernels/cpu_features.h"

#include <cstdio>
#include <cstdlib>

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
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (name == isa_name(i)) return i;
  }
  return std::nullopt;
}

static Isa detect() {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  // The BF16 level also byte-shuffles (VBMI: the FP8 -> BF16 lookups); every CPU with BF16 dot
  // products except Cooper Lake has it.
  bool bf16 =
      avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
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
  Isa cpu = cpu_isa();
  const char* env = std::getenv("MOESERVE_ISA");
  if (!env || !*env) return cpu;
  std::optional<Isa> want = isa_from_name(env);
  if (!want) {
    std::fprintf(stderr, "moeserve: ignoring MOESERVE_ISA=%s (use scalar|avx2|avx512|avx512bf16)\n",
                 env);
    return cpu;
  }
  return isa_at_most(*want, cpu) ? *want : cpu;
}

Isa active_isa() {
  static const Isa isa = pick_active();
  return isa;
}

}  // namespace moeserve
