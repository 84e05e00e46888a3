// pd-bench: the figures of prefill/decode disaggregation that need no model (docs/pd.md "Bench").
//
//   pd-bench transfer [--block-bytes B] [--tokens 2048,8192] [--repeats N]
//     KV transfer GB/s: a hand-off of the tokens' blocks pulled from a KvTransferServer (the
//     protocol: frames, checksums on both sides, acknowledgement) against a raw UCX stream of
//     the same bytes in the same run (into one reused buffer: the wire alone; and each block
//     into a buffer of its own, as a pull must keep them), and a kernel TCP socket stream for
//     reference. Default
//     block: DeepSeek-V3's BF16 latent block (61 layers x 64 tokens x 576 x 2 B).
//   pd-bench balance [--requests N] [--ranks R] [--seed S]
//     The prefill and decode balancers against round-robin on skewed traffic (prompt lengths
//     32-8,000, log-uniform): max/mean over ranks of input tokens, core-attention work and KV
//     blocks, sampled over a simulated run in which ranks drain their work.
// One JSON object on stdout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "router/balancers.h"
#include "transfer/kv_transfer.h"

namespace moeserve {
namespace {

using nlohmann::json;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::shared_ptr<KvHandoff> make_handoff(int64_t tokens, uint64_t block_bytes) {
  auto h = std::make_shared<KvHandoff>();
  h->fingerprint = 1;
  h->block_bytes = block_bytes;
  h->n_prompt = tokens;
  h->n_computed = tokens;
  h->tokens.assign(size_t(tokens + 1), 7);
  std::mt19937_64 rng(5);
  std::ostringstream st;
  st << rng;
  h->rng_state = st.str();
  for (int64_t b = 0; b < (tokens + 63) / 64; ++b) {
    KvBytes bytes(block_bytes);
    for (size_t i = 0; i < bytes.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(bytes.data() + i, &v, std::min<size_t>(8, bytes.size() - i));
    }
    h->blocks.push_back(std::move(bytes));
  }
  return h;
}

// Raw UCX: one stream, the same bytes in the same chunks, no framing, no checksums. keep: each
// block lands in its own buffer and stays there (KvBytes, as a pull's blocks: the receiver must
// keep them); else every block goes to one reused buffer that stays in cache (the wire alone).
double raw_ucx_seconds(const std::shared_ptr<UcxContext>& ctx, const KvHandoff& h, bool keep) {
  std::atomic<bool> sent{false};
  std::thread sender;
  auto l = UcxListener::listen(ctx, "127.0.0.1", 0, [&](std::unique_ptr<UcxStream> s) {
    sender = std::thread([&, st = std::shared_ptr<UcxStream>(std::move(s))] {
      uint8_t go = 0;
      if (!st->recv({&go, 1}, Clock::now() + std::chrono::seconds(30)).ok()) return;
      for (const auto& b : h.blocks) {
        if (!st->send(b, Clock::now() + std::chrono::seconds(30)).ok()) return;
      }
      uint8_t end = 0;
      (void)st->recv({&end, 1}, Clock::now() + std::chrono::seconds(30));
      sent.store(true);
    });
  });
  if (!l.ok()) return -1;
  auto c = UcxStream::connect(ctx, "127.0.0.1", (*l)->port());
  if (!c.ok()) return -1;
  std::vector<uint8_t> buf(h.block_bytes);
  std::vector<KvBytes> kept;
  kept.reserve(h.blocks.size());
  const uint8_t go = 1;
  const auto t0 = Clock::now();
  if (!(*c)->send({&go, 1}, Clock::now() + std::chrono::seconds(30)).ok()) return -1;
  for (size_t b = 0; b < h.blocks.size(); ++b) {
    std::span<uint8_t> into = buf;
    if (keep) into = kept.emplace_back(h.block_bytes);
    if (!(*c)->recv(into, Clock::now() + std::chrono::seconds(30)).ok()) return -1;
  }
  const double dt = seconds_since(t0);
  (void)(*c)->send({&go, 1}, Clock::now() + std::chrono::seconds(30));
  sender.join();
  c->reset();
  return dt;
}

// A kernel TCP socket over loopback, for reference.
double tcp_seconds(const KvHandoff& h) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(ls, 1) != 0) return -1;
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread sender([&] {
    int s = accept(ls, nullptr, nullptr);
    for (const auto& b : h.blocks) {
      size_t off = 0;
      while (off < b.size()) {
        ssize_t n = write(s, b.data() + off, b.size() - off);
        if (n <= 0) break;
        off += size_t(n);
      }
    }
    close(s);
  });
  int c = socket(AF_INET, SOCK_STREAM, 0);
  const auto t0 = Clock::now();
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  std::vector<uint8_t> buf(1 << 20);
  size_t total = 0, want = h.blocks.size() * h.block_bytes;
  while (total < want) {
    ssize_t n = read(c, buf.data(), buf.size());
    if (n <= 0) break;
    total += size_t(n);
  }
  const double dt = seconds_since(t0);
  sender.join();
  close(c);
  close(ls);
  return total == want ? dt : -1;
}

int run_transfer(uint64_t block_bytes, const std::vector<int64_t>& token_counts, int repeats) {
  auto ctx = UcxContext::create();
  if (!ctx.ok()) {
    fmt::print(stderr, "pd-bench: {}\n", ctx.status().message());
    return 1;
  }
  auto srv = KvTransferServer::start(*ctx, {});
  if (!srv.ok()) {
    fmt::print(stderr, "pd-bench: {}\n", srv.status().message());
    return 1;
  }
  const char* tls = std::getenv("UCX_TLS");
  json out = {{"bench", "pd-transfer"},
              {"ucx_tls", tls ? tls : "(default)"},
              {"block_bytes", block_bytes},
              {"cases", json::array()}};
  for (int64_t tokens : token_counts) {
    auto h = make_handoff(tokens, block_bytes);
    const double bytes = double(h->blocks.size()) * double(block_bytes);
    std::vector<double> pull, raw, raw_kept, tcp;
    for (int r = 0; r < repeats; ++r) {  // alternated, best of each
      const std::string handle = fmt::format("t{}-{}", tokens, r);
      if (!(*srv)->offer(handle, h).ok()) return 1;
      const auto t0 = Clock::now();
      auto got = pull_kv(*ctx, (*srv)->address(), handle, h->fingerprint);
      const double dt = seconds_since(t0);
      if (!got.ok() || (*got)->blocks.size() != h->blocks.size()) {
        fmt::print(stderr, "pd-bench: pull failed: {}\n", got.status().to_string());
        return 1;
      }
      pull.push_back(dt);
      raw.push_back(raw_ucx_seconds(*ctx, *h, false));
      raw_kept.push_back(raw_ucx_seconds(*ctx, *h, true));
      tcp.push_back(tcp_seconds(*h));
    }
    const double p = *std::min_element(pull.begin(), pull.end());
    const double u = *std::min_element(raw.begin(), raw.end());
    const double uk = *std::min_element(raw_kept.begin(), raw_kept.end());
    const double t = *std::min_element(tcp.begin(), tcp.end());
    out["cases"].push_back({{"tokens", tokens},
                            {"bytes", bytes},
                            {"pull_s", p},
                            {"pull_gb_s", bytes / p / 1e9},
                            {"raw_ucx_gb_s", bytes / u / 1e9},
                            {"raw_ucx_kept_gb_s", bytes / uk / 1e9},
                            {"vs_raw_ucx_kept", uk / p},
                            {"tcp_socket_gb_s", bytes / t / 1e9},
                            {"vs_raw_ucx", u / p}});
  }
  fmt::print("{}\n", out.dump(2));
  return 0;
}

// ---- balance ----

struct Req {
  int64_t prompt = 0, output = 0;
};

// A run in time steps: requests arrive at a fixed rate; each prefill rank computes `rate`
// input tokens per step (oldest first) and each decode rank produces one token per request per
// step. Loads are sampled every step once the run is warm.
json simulate(bool balanced, int ranks, int n_requests, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(32.0), std::log(8000.0));
  std::uniform_int_distribution<int64_t> out_len(64, 1024);
  struct Prefill {
    std::deque<std::pair<int64_t, double>> queue;  // (tokens left, attention left)
    RankLoad load;
  };
  struct Decode {
    std::vector<std::pair<int64_t, int64_t>> running;  // (tokens left, blocks)
    RankLoad load;
  };
  std::vector<Prefill> pf(static_cast<size_t>(ranks));
  std::vector<Decode> dc(static_cast<size_t>(ranks));
  const int64_t kv_total = 12000;  // blocks per decode rank (~70% used at this load)
  const int64_t rate = 800;        // prefill tokens per rank per step (~90% busy at this load)
  std::vector<double> tok_ratio, attn_ratio, kv_ratio, req_ratio;
  int next_rr_p = 0, next_rr_d = 0;
  std::deque<Req> handed;  // prefilled, waiting for a decode rank (one step later)
  const int arrivals_per_step = std::max(1, ranks / 2);  // (~90% busy prefill ranks at any R)
  // What each rank was given in the current window of kWindow steps (DeepSeek equalizes the
  // input tokens per rank of each batch; a window is the simulation's batch).
  constexpr int kWindow = 25;
  std::vector<double> win_tokens(size_t(ranks), 0.0), win_attn(size_t(ranks), 0.0);
  std::vector<double> wtok_ratio, wattn_ratio;
  int arrived = 0;
  for (int step = 0; arrived < n_requests || step < 10; ++step) {
    for (int a = 0; a < arrivals_per_step && arrived < n_requests; ++a, ++arrived) {
      Req r{int64_t(std::exp(u(rng))), out_len(rng)};
      std::vector<RankLoad> loads;
      for (auto& p : pf) loads.push_back(p.load);
      const size_t k =
          balanced ? choose_prefill(loads, {}, r.prompt)->rank : size_t(next_rr_p++ % ranks);
      pf[k].queue.push_back({r.prompt, attention_work(r.prompt, 0)});
      pf[k].load.input_tokens += r.prompt;
      pf[k].load.attention += attention_work(r.prompt, 0);
      pf[k].load.assigned_total += r.prompt;
      win_tokens[k] += double(r.prompt);
      win_attn[k] += attention_work(r.prompt, 0);
      handed.push_back(r);
    }
    while (!handed.empty()) {
      const Req r = handed.front();
      handed.pop_front();
      const int64_t blocks = (r.prompt + r.output + 63) / 64;
      std::vector<RankLoad> loads;
      for (auto& d : dc) loads.push_back(d.load);
      const size_t k = balanced ? *choose_decode(loads, blocks) : size_t(next_rr_d++ % ranks);
      dc[k].running.push_back({r.output, blocks});
      dc[k].load.requests += 1;
      dc[k].load.kv_used += blocks;
    }
    // Work drains.
    for (auto& p : pf) {
      int64_t budget = rate;
      while (budget > 0 && !p.queue.empty()) {
        auto& [left, attn] = p.queue.front();
        const int64_t n = std::min(budget, left);
        const double a = attn * double(n) / double(left);
        left -= n;
        attn -= a;
        budget -= n;
        p.load.input_tokens -= n;
        p.load.attention -= a;
        if (left == 0) p.queue.pop_front();
      }
    }
    for (auto& d : dc) {
      d.load.kv_total = kv_total;
      for (auto it = d.running.begin(); it != d.running.end();) {
        if (--it->first == 0) {
          d.load.requests -= 1;
          d.load.kv_used -= it->second;
          it = d.running.erase(it);
        } else {
          ++it;
        }
      }
    }
    auto ratio = [&](auto get, auto& v) {
      double mx = 0, sum = 0;
      for (int r = 0; r < ranks; ++r) {
        const double x = get(r);
        mx = std::max(mx, x);
        sum += x;
      }
      if (sum > 0) v.push_back(mx / (sum / ranks));
    };
    if ((step + 1) % kWindow == 0) {
      ratio([&](int r) { return win_tokens[size_t(r)]; }, wtok_ratio);
      ratio([&](int r) { return win_attn[size_t(r)]; }, wattn_ratio);
      std::fill(win_tokens.begin(), win_tokens.end(), 0.0);
      std::fill(win_attn.begin(), win_attn.end(), 0.0);
    }
    if (step < 20) continue;  // warm-up
    ratio([&](int r) { return double(pf[size_t(r)].load.input_tokens); }, tok_ratio);
    ratio([&](int r) { return pf[size_t(r)].load.attention; }, attn_ratio);
    ratio([&](int r) { return double(dc[size_t(r)].load.kv_used); }, kv_ratio);
    ratio([&](int r) { return double(dc[size_t(r)].load.requests); }, req_ratio);
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / double(v.size());
  };
  auto p99 = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[size_t(0.99 * double(v.size() - 1))];
  };
  return {{"window_input_tokens_max_over_mean", mean(wtok_ratio)},
          {"window_attention_max_over_mean", mean(wattn_ratio)},
          {"queued_input_tokens_max_over_mean", mean(tok_ratio)},
          {"queued_attention_max_over_mean", mean(attn_ratio)},
          {"kv_blocks_max_over_mean", mean(kv_ratio)},
          {"kv_blocks_max_over_mean_p99", p99(kv_ratio)},
          {"decode_requests_max_over_mean", mean(req_ratio)}};
}

int run_balance(int ranks, int requests, uint64_t seed) {
  json out = {{"bench", "pd-balance"},
              {"ranks", ranks},
              {"requests", requests},
              {"prompt_lengths", "32-8000, log-uniform"},
              {"output_lengths", "64-1024, uniform"},
              {"balancers", simulate(true, ranks, requests, seed)},
              {"round_robin", simulate(false, ranks, requests, seed)}};
  fmt::print("{}\n", out.dump(2));
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  CLI::App app{"pd-bench: KV transfer and balancer figures (docs/pd.md)"};
  app.require_subcommand(1);
  auto* transfer = app.add_subcommand("transfer", "KV transfer GB/s against raw streams");
  uint64_t block_bytes = 61ull * 64 * 576 * 2;
  std::vector<int64_t> tokens = {2048, 8192};
  int repeats = 3;
  transfer->add_option("--block-bytes", block_bytes, "Bytes per KV block")->capture_default_str();
  transfer->add_option("--tokens", tokens, "Prompt lengths")->delimiter(',');
  transfer->add_option("--repeats", repeats, "Alternated repetitions (best of)")
      ->capture_default_str();
  auto* balance = app.add_subcommand("balance", "Balancers against round-robin, simulated");
  int ranks = 4, requests = 4000;
  uint64_t seed = 1;
  balance->add_option("--ranks", ranks, "DP-attention ranks (2 units x 2 ranks)")
      ->capture_default_str();
  balance->add_option("--requests", requests, "Requests")->capture_default_str();
  balance->add_option("--seed", seed, "Seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (transfer->parsed()) return moeserve::run_transfer(block_bytes, tokens, repeats);
  return moeserve::run_balance(ranks, requests, seed);
}
