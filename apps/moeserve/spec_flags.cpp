#include "spec_flags.h"

namespace moeserve::cli {

void add_spec_flags(CLI::App& app, SpecFlags& f) {
  app.add_option("--speculative", f.speculative,
                 "Speculative decoding with the checkpoint's MTP module: mtp (output unchanged: "
                 "greedy tokens equal, sampled ones distributed as without it)")
      ->check(CLI::IsMember({"mtp"}));
  app.add_option("--num-draft-tokens", f.num_draft_tokens,
                 "Draft tokens per step with --speculative (the module chained)")
      ->check(CLI::Range(int64_t(1), int64_t(EngineStats::kMaxDraftTokens)))
      ->capture_default_str();
  app.add_option("--speculative-max-rows", f.max_rows,
                 "Drafts only while decoding sequences x (1 + drafts) stay within this many rows "
                 "per step (fewer drafts, then none, above it); -1: automatic (where the expert "
                 "GEMMs turn compute-bound), 0: no limit")
      ->capture_default_str();
}

}  // namespace moeserve::cli
