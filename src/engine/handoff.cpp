#include "engine/handoff.h"

#include <algorithm>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "kernels/sampling.h"

namespace moeserve {

Status extend_handoff(KvHandoff& h, const std::vector<int32_t>& generated,
                      const SamplingParams& sampling) {
  if (generated.empty()) return Status::Ok();
  const int64_t have = h.n_generated();
  if (int64_t(generated.size()) < have ||
      !std::equal(h.tokens.begin() + h.n_prompt, h.tokens.end(), generated.begin())) {
    return InvalidArgument(fmt::format(
        "the hand-off's {} generated token(s) are not the first of the {} the client has", have,
        generated.size()));
  }
  const int64_t added = int64_t(generated.size()) - have;
  if (added == 0) return Status::Ok();
  h.tokens.insert(h.tokens.end(), generated.begin() + have, generated.end());
  if (sampling.temperature > 0.0f) {
    std::mt19937_64 rng;
    std::istringstream in(h.rng_state);
    if (!(in >> rng)) return InvalidArgument("the hand-off's sampler state does not parse");
    rng.discard(uint64_t(added));
    std::ostringstream out;
    out << rng;
    h.rng_state = out.str();
  }
  return Status::Ok();
}

}  // namespace moeserve
