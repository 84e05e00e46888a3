#include "model/packed_linear.h"

#include <vector>

#include "core/check.h"

namespace moeserve {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFp8:
      return "fp8";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

std::optional<WeightFormat> weight_format_from_name(std::string_view name) {
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kInt8, WeightFormat::kInt4}) {
    if (name == weight_format_name(f)) return f;
  }
  return std::nullopt;
}

const char* head_format_name(HeadFormat f) {
  switch (f) {
    case HeadFormat::kBf16:
      return "bf16";
    case HeadFormat::kInt8:
      return "int8";
    case HeadFormat::kInt4:
      return "int4";
  }
  return "?";
}

std::optional<HeadFormat> head_format_from_name(std::string_view name) {
  for (HeadFormat f : {HeadFormat::kBf16, HeadFormat::kInt8, HeadFormat::kInt4}) {
    if (name == head_format_name(f)) return f;
  }
  return std::nullopt;
}

PackedLinear pack_linear(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k,
                         WeightFormat format) {
  PackedLinear p;
  switch (format) {
    case WeightFormat::kInt8:
      p.int8 = pack_int8_weight(w, scale_inv, n, k);
      break;
    case WeightFormat::kInt4:
      p.int4 = pack_int4_weight(w, scale_inv, n, k);
      break;
    case WeightFormat::kFp8:
      p.fp8 = pack_fp8_weight(w, scale_inv, n, k);
      break;
  }
  return p;
}

void gemm_linear(const uint16_t* x, int64_t m, int64_t ldx, const PackedLinear& w, GemmOutput y,
                 ThreadPool* pool) {
  switch (w.format()) {
    case WeightFormat::kInt8:
      return gemm_int8(x, m, ldx, w.int8, y, pool);
    case WeightFormat::kInt4:
      return gemm_int4(x, m, ldx, w.int4, y, pool);
    case WeightFormat::kFp8:
      return gemm_fp8(x, m, ldx, w.fp8, y, pool);
  }
}

namespace {

// The experts' weights of one format, checked to be all of it.
template <class Weight>
std::vector<const Weight*> of_format(std::span<const PackedLinear* const> experts,
                                     WeightFormat format, Weight PackedLinear::*member) {
  std::vector<const Weight*> w(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    CHECK(experts[e]->format() == format, "grouped GEMM: experts of mixed formats");
    w[e] = &(experts[e]->*member);
  }
  return w;
}

}  // namespace

void gemm_linear_grouped(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                         const int64_t* offsets, std::span<const PackedLinear* const> experts,
                         GemmOutput y, ThreadPool* pool) {
  if (experts.empty()) return;
  const WeightFormat format = experts[0]->format();
  const int64_t n = int64_t(experts.size());
  if (format == WeightFormat::kInt8) {
    auto w = of_format(experts, format, &PackedLinear::int8);
    if (x_rows)
      return gemm_int8_grouped_contiguous_gather(x, ldx, x_rows, offsets, w.data(), n, y, pool);
    return gemm_int8_grouped_contiguous(x, ldx, offsets, w.data(), n, y, pool);
  }
  if (format == WeightFormat::kInt4) {
    auto w = of_format(experts, format, &PackedLinear::int4);
    if (x_rows)
      return gemm_int4_grouped_contiguous_gather(x, ldx, x_rows, offsets, w.data(), n, y, pool);
    return gemm_int4_grouped_contiguous(x, ldx, offsets, w.data(), n, y, pool);
  }
  auto w = of_format(experts, format, &PackedLinear::fp8);
  if (x_rows)
    return gemm_fp8_grouped_contiguous_gather(x, ldx, x_rows, offsets, w.data(), n, y, pool);
  gemm_fp8_grouped_contiguous(x, ldx, offsets, w.data(), n, y, pool);
}

}  // namespace moeserve
