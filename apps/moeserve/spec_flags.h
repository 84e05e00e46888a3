// The speculative-decoding flags that `generate` and `serve` share (docs/mtp.md).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/engine_core.h"

namespace moeserve::cli {

struct SpecFlags {
  std::string speculative;  // "" (off) or "mtp"
  int64_t num_draft_tokens = 1;
  int64_t max_rows = -1;  // SpeculativeConfig::max_rows

  bool enabled() const { return !speculative.empty(); }
  SpeculativeConfig config() const {
    return {enabled() ? num_draft_tokens : 0, max_rows};
  }
};

void add_spec_flags(CLI::App& app, SpecFlags& flags);

}  // namespace moeserve::cli
