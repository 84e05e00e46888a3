// The requantized-weight flags (docs/quantization.md, docs/kernels-int8.md), shared by
// `moeserve generate|serve|perplexity` and `moeserve-bench e2e`.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "model/causal_lm.h"

namespace moeserve::cli {

// `--projection-dtype`, `--expert-dtype` and `--lm-head-dtype`, with `--gemm-int8` and
// `--lm-head-int8` for their INT8 forms; they set o, which must outlive the parse.
inline void add_format_flags(CLI::App& app, WeightFormats& o) {
  app.add_option_function<std::string>(
         "--projection-dtype",
         [&o](const std::string& v) { o.projections = *weight_format_from_name(v); },
         "Every FP8 projection (attention, dense and shared MLPs, and the routed experts unless "
         "--expert-dtype says otherwise): fp8 (the checkpoint's) | int8 (per 1x128, symmetric; "
         "AMX/VNNI INT8 dot products) | int4 (per 1x128, asymmetric, 0.5625 bytes per weight); "
         "requantized at load, changes numerics (docs/quantization.md)")
      ->check(CLI::IsMember({"fp8", "int8", "int4"}));
  app.add_option_function<std::string>(
         "--expert-dtype", [&o](const std::string& v) { o.experts = weight_format_from_name(v); },
         "The routed experts' weights: fp8 (the checkpoint's) | int8 (per 1x128, symmetric) | "
         "int4 (per 1x128, asymmetric: 0.5625 bytes per weight, DeepSeek-V3 in ~390 GB); "
         "requantized at load, changes numerics (docs/quantization.md). Default: the other "
         "projections' format")
      ->check(CLI::IsMember({"fp8", "int8", "int4"}));
  app.add_option_function<std::string>(
         "--lm-head-dtype", [&o](const std::string& v) { o.lm_head = *head_format_from_name(v); },
         "The lm_head: bf16 (the checkpoint's) | int8 (per 1x128, half its bytes per decoded "
         "token) | int4 (per 1x128, asymmetric, 0.28 of them); changes numerics")
      ->check(CLI::IsMember({"bf16", "int8", "int4"}));
  app.add_flag_callback(
      "--gemm-int8", [&o] { o.projections = WeightFormat::kInt8; },
      "--projection-dtype int8: every FP8 projection as INT8 GEMMs (docs/kernels-int8.md for "
      "the measured accuracy)");
  app.add_flag_callback(
      "--lm-head-int8", [&o] { o.lm_head = HeadFormat::kInt8; }, "--lm-head-dtype int8");
}

}  // namespace moeserve::cli
