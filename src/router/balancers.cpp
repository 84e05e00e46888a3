#include "router/balancers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moeserve {

double attention_work(int64_t n_new, int64_t n_cached) {
  // sum over i in [0, n_new) of (n_cached + i + 1)
  return double(n_new) * double(n_cached) + double(n_new) * double(n_new + 1) / 2;
}

std::optional<PrefillPick> choose_prefill(std::span<const RankLoad> ranks,
                                          std::span<const int64_t> cached, int64_t prompt_tokens,
                                          double slack) {
  // Each rank's load after taking the request, tokens and attention each scaled by their mean
  // over accepting ranks (after the request), so that they compare.
  double sum_tokens = 0, sum_attn = 0;
  int n = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].accepting) continue;
    sum_tokens += double(ranks[r].input_tokens);
    sum_attn += ranks[r].attention;
    ++n;
  }
  if (n == 0) return std::nullopt;
  auto hit = [&](size_t r) {
    return std::clamp<int64_t>(r < cached.size() ? cached[r] : 0, 0, prompt_tokens - 1);
  };
  const double mean_tokens = (sum_tokens + double(prompt_tokens)) / n + 1;
  const double mean_attn = (sum_attn + attention_work(prompt_tokens, 0)) / n + 1;
  // The rank's worse of the two after taking the request: the choice that keeps both
  // maxima low (a sum would let one rank trade many short prompts for a few long ones).
  auto score = [&](size_t r) {
    const int64_t h = hit(r);
    return std::max(double(ranks[r].input_tokens + prompt_tokens - h) / mean_tokens,
                    (ranks[r].attention + attention_work(prompt_tokens - h, h)) / mean_attn);
  };
  size_t best = ranks.size(), by_hit = ranks.size();
  double best_score = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].accepting) continue;
    const double s = score(r);
    const bool tie = best < ranks.size() && std::abs(s - best_score) <= 1e-9 * (1 + best_score);
    if ((!tie && s < best_score) || (tie && ranks[r].assigned_total < ranks[best].assigned_total)) {
      best_score = s;
      best = r;
    }
    if (hit(r) > 0 && (by_hit == ranks.size() || hit(r) > hit(by_hit))) by_hit = r;
  }
  if (by_hit != ranks.size() && by_hit != best && score(by_hit) <= (1 + slack) * best_score) {
    return PrefillPick{by_hit, true};
  }
  return PrefillPick{best, best == by_hit};
}

std::optional<size_t> choose_decode(std::span<const RankLoad> ranks, int64_t blocks_needed) {
  auto usage = [](const RankLoad& l) {
    return l.kv_total > 0 ? double(l.kv_used) / double(l.kv_total) : 1.0;
  };
  std::optional<size_t> best;
  bool best_room = false;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankLoad& l = ranks[r];
    if (!l.accepting) continue;
    const bool room = l.kv_total - l.kv_used >= blocks_needed;
    if (!best) {
      best = r;
      best_room = room;
      continue;
    }
    const RankLoad& b = ranks[*best];
    bool better;
    if (room != best_room) {
      better = room;
    } else if (room) {
      better = l.requests < b.requests || (l.requests == b.requests && usage(l) < usage(b));
    } else {
      better = usage(l) < usage(b) || (usage(l) == usage(b) && l.requests < b.requests);
    }
    if (better) {
      best = r;
      best_room = room;
    }
  }
  return best;
}

}  // namespace moeserve
