// The model fingerprint: one 64-bit digest of everything that decides the bits of a KV block
// (docs/engine.md "The block owner"), the seed of the KV cache's hash chain. Two caches with
// different fingerprints never share a block, in RAM or in a lower tier.
//
// Covered: config.json, model.safetensors.index.json (when present), the header of every
// .safetensors file in the directory (names, dtypes, shapes, byte ranges) and four 16 KB
// samples of its tensor data (checkpoints with identical headers, such as DeepSeek-V3 and R1,
// differ there), the KV dtype, the compute path (it changes how the latent is rounded),
// kKvLayoutVersion, whether blocks hold the MTP module's layer, the projections' format
// (--projection-dtype / --gemm-int8: the latent's bits change) and the routed experts' format
// (--expert-dtype).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "model/causal_lm.h"

namespace moeserve {

// Errors name the file that could not be read.
// experts: the routed experts' format when given (WeightFormats::experts; none: the other
// projections').
Result<uint64_t> model_fingerprint(const std::string& model_dir, DType kv_dtype,
                                   ComputePath compute, bool mtp = false,
                                   WeightFormat projections = WeightFormat::kFp8,
                                   std::optional<WeightFormat> experts = std::nullopt);

}  // namespace moeserve
