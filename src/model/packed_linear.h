// A projection prepared for the fast path's GEMMs: the FP8 weight repacked for gemm_fp8, or, with
// the opt-in INT8 path (--gemm-int8, docs/kernels-int8.md), requantized for gemm_int8 instead
// (the same bytes per weight plus 3% of scales), or, for routed experts with --expert-dtype int4
// (docs/quantization.md), requantized for gemm_int4 (0.5625 bytes per weight). One format is
// held, never two.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>

#include "core/thread_pool.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_int8.h"

namespace moeserve {

enum class WeightFormat : uint8_t { kFp8, kInt8, kInt4 };
const char* weight_format_name(WeightFormat f);
// The inverse of weight_format_name ("fp8", "int8", "int4"); nullopt for any other name.
std::optional<WeightFormat> weight_format_from_name(std::string_view name);

// The lm_head's format on the fast path: the checkpoint's BF16, or requantized per 1x128 at load
// (INT8 symmetric as gemm_int8, INT4 asymmetric as gemm_int4).
enum class HeadFormat : uint8_t { kBf16, kInt8, kInt4 };
const char* head_format_name(HeadFormat f);
// The inverse of head_format_name ("bf16", "int8", "int4"); nullopt for any other name.
std::optional<HeadFormat> head_format_from_name(std::string_view name);

struct PackedLinear {
  PackedFp8Weight fp8;
  PackedInt8Weight int8;  // held instead of fp8 on the INT8 path
  PackedInt4Weight int4;  // held instead of fp8 for INT4 experts

  WeightFormat format() const {
    return int8.data ? WeightFormat::kInt8 : int4.data ? WeightFormat::kInt4 : WeightFormat::kFp8;
  }
  bool is_int8() const { return format() == WeightFormat::kInt8; }
  size_t bytes() const { return int8.data ? int8.bytes() : int4.data ? int4.bytes() : fp8.bytes(); }
};

// From the checkpoint's FP8 bytes [n, k] and 128x128 block scales.
PackedLinear pack_linear(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k,
                         WeightFormat format);

// Keyed by the checkpoint bytes a projection came from.
using PackedLinears = std::unordered_map<const uint8_t*, PackedLinear>;

// gemm_fp8 / gemm_int8 on whichever the projection holds; x: BF16 [m, k], row stride ldx.
void gemm_linear(const uint16_t* x, int64_t m, int64_t ldx, const PackedLinear& w, GemmOutput y,
                 ThreadPool* pool);

// The grouped-contiguous GEMMs (x_rows null: rows in place; else gathered, as
// gemm_fp8_grouped_contiguous_gather) over experts that all hold the same format.
void gemm_linear_grouped(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                         const int64_t* offsets, std::span<const PackedLinear* const> experts,
                         GemmOutput y, ThreadPool* pool);

}  // namespace moeserve
