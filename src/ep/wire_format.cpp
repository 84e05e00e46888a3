#include "ep/wire_format.h"

namespace moeserve {

const char* dispatch_dtype_name(DispatchDType t) {
  switch (t) {
    case DispatchDType::kFp8:
      return "fp8";
    case DispatchDType::kBf16:
      return "bf16";
    case DispatchDType::kF32:
      return "f32";
  }
  return "?";
}

std::optional<DispatchDType> dispatch_dtype_from_name(std::string_view name) {
  if (name == "fp8") return DispatchDType::kFp8;
  if (name == "bf16") return DispatchDType::kBf16;
  if (name == "f32") return DispatchDType::kF32;
  return std::nullopt;
}

DispatchRecordLayout DispatchRecordLayout::make(int64_t hidden, int64_t top_k,
                                                DispatchDType dtype) {
  DispatchRecordLayout l;
  l.hidden = hidden;
  l.top_k = top_k;
  l.dtype = dtype;
  l.n_scales =
      dtype == DispatchDType::kFp8 ? (hidden + kDispatchScaleGroup - 1) / kDispatchScaleGroup : 0;
  l.ids_offset = kRecordCountOffset + 4;
  l.weights_offset = l.ids_offset + 4 * size_t(top_k);
  l.scales_offset = l.weights_offset + 4 * size_t(top_k);
  l.payload_offset = l.scales_offset + 4 * size_t(l.n_scales);
  size_t payload = size_t(hidden) * (dtype == DispatchDType::kFp8    ? 1
                                     : dtype == DispatchDType::kBf16 ? 2
                                                                     : 4);
  l.bytes = (l.payload_offset + payload + 3) / 4 * 4;
  return l;
}

}  // namespace moeserve
