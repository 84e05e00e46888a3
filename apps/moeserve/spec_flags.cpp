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
                 "-1: drafts per step chosen by measurement (the number of drafts, 0 included, "
                 "with the most tokens/s at the current load); N > 0: drafts only while decoding "
                 "sequences x (1 + drafts) stay within N rows per step; 0: always all of them")
      ->capture_default_str();
}

}  // namespace moeserve::cli
