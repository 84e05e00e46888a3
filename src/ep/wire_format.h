// The bytes that dispatch and combine put on the wire (docs/ep-wire-format.md has the
// arithmetic). Plain layout functions; no I/O.
//
// Dispatch: one record per (token, destination rank) — a token goes once to each rank that holds
// at least one of its top-k experts, whatever the number of experts there:
//   int32  count                 entries valid below (1..top_k): the token's experts on that rank
//   int32  ids[top_k]            global expert ids, in the token's top-k slot order; the rest 0
//   f32    weights[top_k]        their gate weights; the rest 0
//   f32    scales[hidden/128]    1x128 FP8 scales (FP8 payload only; last group may be partial)
//   u8     payload               FP8 e4m3 [hidden], BF16 [hidden] (2 bytes each), or F32 [hidden]
//   padding to a multiple of 4 bytes
// Records to one rank are consecutive, in the source's token order.
// Combine: one BF16 row [hidden] per (token, expert) entry (F32 with the F32 payload), sent back to
// the token's rank in the order the entries arrived (source rank, record, entry).
// F32 is not a serving format: it is lossless, so EP can be checked against one process exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moeserve {

enum class DispatchDType { kFp8, kBf16, kF32 };

const char* dispatch_dtype_name(DispatchDType t);  // "fp8", "bf16", "f32"
std::optional<DispatchDType> dispatch_dtype_from_name(std::string_view name);

struct DispatchRecordLayout {
  int64_t hidden = 0;
  int64_t top_k = 0;
  DispatchDType dtype = DispatchDType::kFp8;
  int64_t n_scales = 0;  // FP8: ceil(hidden / 128); BF16: 0
  size_t ids_offset = 0, weights_offset = 0, scales_offset = 0, payload_offset = 0;
  size_t bytes = 0;  // whole record, multiple of 4

  static DispatchRecordLayout make(int64_t hidden, int64_t top_k, DispatchDType dtype);
};

constexpr int64_t kDispatchScaleGroup = 128;  // columns per FP8 scale
constexpr size_t kRecordCountOffset = 0;

// Bytes of one combine row: BF16, or F32 with the F32 payload.
inline size_t combine_row_bytes(int64_t hidden, DispatchDType dtype) {
  return size_t(hidden) * (dtype == DispatchDType::kF32 ? 4 : 2);
}

}  // namespace moeserve
