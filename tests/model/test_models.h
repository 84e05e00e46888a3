// Helpers for model tests: small random checkpoints written by make_model into a temp dir.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "model/make_model.h"

namespace moeserve::testing {

// A small V3-style model (partial 128-blocks everywhere) written once per process per name.
inline std::string small_model_dir(const std::string& name, const std::string& preset,
                                   std::vector<std::string> overrides = {}) {
  std::string dir = (std::filesystem::path(::testing::TempDir()) /
                     ("moeserve_" + name + "_" + std::to_string(::getpid())))
                        .string();
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  MakeModelOptions o;
  o.preset = preset;
  o.overrides = {"vocab_size=1000",  "hidden_size=200",          "q_lora_rank=96",
                 "kv_lora_rank=160", "moe_intermediate_size=72", "intermediate_size=264"};
  o.overrides.insert(o.overrides.end(), overrides.begin(), overrides.end());
  o.seed = 3;
  auto r = make_model(o, dir, nullptr);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return dir;
}

}  // namespace moeserve::testing
