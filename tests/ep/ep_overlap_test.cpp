// Dual micro-batch overlap (docs/ep-overlap.md):
//   - the communication worker runs jobs in submission order and hands results back;
//   - the split balances attention work and never splits a sequence;
//   - in-process EP groups of R = 2 and 4 (ranks as threads, F32 dispatch payload), each rank
//     stepping its own sequences (one rank with none, one with a single sequence, so empty
//     micro-batches join every exchange; chunked prefill mixed with decode): overlap on gives
//     bit-identical logits to overlap off, and both give the single process's greedy tokens
//     with logprobs within 1e-5;
//   - the serving engine (EngineOptions::overlap) gives the same tokens and logprobs with
//     overlap on and off, with requests spread over the ranks (DP attention);
//   - the trace names each exchange by layer and micro-batch on the communication lane.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "../model/test_models.h"
#include "cache/kv_cache.h"
#include "engine/llm_engine.h"
#include "ep/comm_worker.h"
#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"
#include "kernels/sampling.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"

namespace moeserve {
namespace {

TEST(CommWorker, RunsJobsInSubmissionOrder) {
  CommWorker w;
  std::vector<int> order;  // written only by the worker thread
  std::vector<std::future<int>> done;
  for (int i = 0; i < 50; ++i) {
    done.push_back(w.submit([&order, i] {
      if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      order.push_back(i);
      return i * i;
    }));
  }
  for (int i = 0; i < 50; ++i) EXPECT_EQ(done[size_t(i)].get(), i * i);
  std::vector<int> want(50);
  for (int i = 0; i < 50; ++i) want[size_t(i)] = i;
  EXPECT_EQ(order, want);
  Status bad = w.submit([] { return Unavailable("peer gone"); }).get();
  EXPECT_EQ(bad.code(), StatusCode::kUnavailable);
}

TEST(CommWorker, DestructorRunsQueuedJobs) {
  std::atomic<int> ran{0};
  {
    CommWorker w;
    for (int i = 0; i < 10; ++i) w.submit([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 10);
}

StepSequence seq_of(const std::vector<int32_t>& tokens, int64_t start) {
  StepSequence s;
  s.tokens = tokens;
  s.start_pos = start;
  return s;
}

TEST(MicroBatchSplit, BalancesAttentionWorkAndKeepsSequencesWhole) {
  std::vector<int32_t> t1(1), t4(4), t40(40);
  // Attention work = n * start + n (n + 1) / 2: 40-token prefill 820; decodes at 99, 49, 9, 9
  // have 100, 50, 10, 10; a 4-token chunk at 300 has 1210.
  std::vector<StepSequence> b = {seq_of(t40, 0),  seq_of(t1, 99), seq_of(t1, 49),
                                 seq_of(t4, 300), seq_of(t1, 9),  seq_of(t1, 9)};
  auto split = split_micro_batches(b);
  std::vector<size_t> all = split[0];
  all.insert(all.end(), split[1].begin(), split[1].end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));  // each sequence once
  auto work = [&](const std::vector<size_t>& m) {
    int64_t w = 0;
    for (size_t i : m) {
      int64_t n = int64_t(b[i].tokens.size());
      w += n * b[i].start_pos + n * (n + 1) / 2;
    }
    return w;
  };
  // Longest first: 1210 | 820, then 100, 50, 10, 10 go to the lighter: 1210 | 990.
  EXPECT_EQ(std::max(work(split[0]), work(split[1])), 1210);
  EXPECT_EQ(std::min(work(split[0]), work(split[1])), 990);
  EXPECT_TRUE(std::is_sorted(split[0].begin(), split[0].end()));
  EXPECT_TRUE(std::is_sorted(split[1].begin(), split[1].end()));

  // Decode at equal contexts: half each. One sequence: the other is empty. None: both empty.
  std::vector<StepSequence> d(8, seq_of(t1, 20));
  split = split_micro_batches(d);
  EXPECT_EQ(split[0].size(), 4u);
  EXPECT_EQ(split[1].size(), 4u);
  split = split_micro_batches(std::span<const StepSequence>(d.data(), 1));
  EXPECT_EQ(split[0].size() + split[1].size(), 1u);
  split = split_micro_batches({});
  EXPECT_TRUE(split[0].empty() && split[1].empty());
}

// A sequence stepped by the test: a prompt prefilled in chunks, then greedy decode.
struct TestSeq {
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t prompt_len = 0;
  int64_t computed = 0;
  std::vector<int32_t> block_table;
  std::vector<int32_t> generated;
  std::vector<float> logprobs;             // of each generated token
  std::vector<std::vector<float>> logits;  // each step's logits row
};

constexpr int kSteps = 7;
constexpr int64_t kChunk = 24;

std::vector<TestSeq> rank_seqs(int rank, int32_t* next_block) {
  // Rank 0: two sequences; rank 1: none; rank 2: one; rank 3: three (R = 4). Prompt lengths
  // differ, so long prompts are still prefilling in chunks while short ones decode.
  const int counts[] = {2, 0, 1, 3};
  std::vector<TestSeq> out;
  for (int i = 0; i < counts[rank]; ++i) {
    TestSeq s;
    s.prompt_len = 3 + 29 * ((rank + 2 * i) % 3) + 7 * i;
    for (int64_t t = 0; t < s.prompt_len; ++t) {
      s.tokens.push_back(int32_t((t * 41 + rank * 131 + i * 17 + 5) % 1000));
    }
    int32_t nb = int32_t((s.prompt_len + kSteps + kKvBlockSize - 1) / kKvBlockSize);
    for (int32_t b = 0; b < nb; ++b) s.block_table.push_back((*next_block)++);
    out.push_back(std::move(s));
  }
  return out;
}

// kSteps forward passes over seqs (an empty list still steps: it joins the exchanges).
Status run_steps(DeepseekModel& model, KvCache& cache, std::vector<TestSeq>& seqs) {
  const int64_t V = model.config().vocab_size;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<StepSequence> batch;
    std::vector<size_t> with_logits;
    for (size_t i = 0; i < seqs.size(); ++i) {
      TestSeq& s = seqs[i];
      int64_t take = s.computed < s.prompt_len ? std::min(kChunk, s.prompt_len - s.computed) : 1;
      StepSequence b;
      b.tokens = std::span<const int32_t>(s.tokens).subspan(size_t(s.computed), size_t(take));
      b.start_pos = s.computed;
      b.block_table = s.block_table;
      b.n_logits = s.computed + take >= s.prompt_len ? 1 : 0;
      if (b.n_logits > 0) with_logits.push_back(i);
      batch.push_back(b);
    }
    StepOutput out;
    RETURN_IF_ERROR(model.forward(batch, cache, &out));
    const std::vector<float>& logits = out.logits;
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].computed += int64_t(batch[i].tokens.size());
    for (size_t j = 0; j < with_logits.size(); ++j) {
      TestSeq& s = seqs[with_logits[j]];
      const float* row = &logits[j * size_t(V)];
      std::vector<float> lp(static_cast<size_t>(V));
      log_softmax(row, V, lp.data());
      int32_t tok = int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
      s.generated.push_back(tok);
      s.logprobs.push_back(lp[size_t(tok)]);
      s.logits.emplace_back(row, row + V);
      s.tokens.push_back(tok);
    }
  }
  return Status::Ok();
}

std::string model_dir() {
  return testing::small_model_dir("ep_overlap", "tiny");
}

int32_t cache_blocks() {
  return 64;
}

// Every rank's sequences after kSteps, on an in-process group of R.
std::vector<std::vector<TestSeq>> run_group(int R, bool overlap, Tracer* tracer0 = nullptr) {
  auto comms = make_in_process_group(R, CommOptions{std::chrono::milliseconds(60000)});
  std::vector<std::vector<TestSeq>> out(static_cast<size_t>(R));
  int32_t next_block = 0;
  for (int r = 0; r < R; ++r) out[size_t(r)] = rank_seqs(r, &next_block);
  std::vector<Status> status(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  const std::string dir = model_dir();  // written once, before the ranks' threads read it
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      auto ck = Checkpoint::open(dir);
      if (!ck.ok()) {
        status[size_t(r)] = ck.status();
        return;
      }
      const ModelConfig& c = (*ck)->config();
      EpOptions eo;
      eo.dtype = DispatchDType::kF32;  // lossless: comparable with one process
      auto placement = ExpertPlacement::contiguous(c.n_routed_experts, R);
      auto d = EpDispatcher::create(*comms[size_t(r)], std::move(*placement), eo);
      if (!d.ok()) {
        status[size_t(r)] = d.status();
        return;
      }
      DeepseekModel model(c, (*ck)->weights(), **d, nullptr, AttentionMode::kAbsorbed,
                          ComputePath::kFast, overlap);
      model.set_overlap_min_tokens(0);  // every step splits (the automatic rule would not here)
      if (r == 0) model.set_tracer(tracer0);
      KvCache cache(kv_cache_layout(c, DType::kF32), cache_blocks());
      status[size_t(r)] = run_steps(model, cache, out[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < R; ++r) EXPECT_TRUE(status[size_t(r)].ok()) << status[size_t(r)].to_string();
  return out;
}

// All ranks' sequences in one process, one batch per step.
std::vector<std::vector<TestSeq>> run_single(int R) {
  std::vector<std::vector<TestSeq>> per_rank(static_cast<size_t>(R));
  int32_t next_block = 0;
  std::vector<TestSeq> all;
  for (int r = 0; r < R; ++r) {
    per_rank[size_t(r)] = rank_seqs(r, &next_block);
    for (auto& s : per_rank[size_t(r)]) all.push_back(s);
  }
  auto ck = Checkpoint::open(model_dir());
  EXPECT_TRUE(ck.ok());
  const ModelConfig& c = (*ck)->config();
  LocalDispatcher local(c.n_routed_experts);
  DeepseekModel model(c, (*ck)->weights(), local, nullptr, AttentionMode::kAbsorbed,
                      ComputePath::kFast);
  KvCache cache(kv_cache_layout(c, DType::kF32), cache_blocks());
  Status st = run_steps(model, cache, all);
  EXPECT_TRUE(st.ok()) << st.to_string();
  size_t k = 0;
  for (auto& rank : per_rank) {
    for (auto& s : rank) s = all[k++];
  }
  return per_rank;
}

TEST(EpOverlap, SameLogitsAsNoOverlapAndOneProcess) {
  for (int R : {2, 4}) {
    auto single = run_single(R);
    auto off = run_group(R, false);
    auto on = run_group(R, true);
    size_t n_seqs = 0;
    for (int r = 0; r < R; ++r) {
      const auto& a = off[size_t(r)];
      const auto& b = on[size_t(r)];
      const auto& s = single[size_t(r)];
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(a.size(), s.size());
      for (size_t i = 0; i < a.size(); ++i, ++n_seqs) {
        SCOPED_TRACE(fmt::format("R={} rank {} sequence {}", R, r, i));
        ASSERT_FALSE(b[i].generated.empty());
        EXPECT_EQ(b[i].generated, a[i].generated);
        EXPECT_EQ(b[i].logits, a[i].logits) << "overlap on and off must agree bit for bit";
        EXPECT_EQ(b[i].generated, s[i].generated);
        ASSERT_EQ(b[i].logprobs.size(), s[i].logprobs.size());
        for (size_t t = 0; t < s[i].logprobs.size(); ++t) {
          EXPECT_NEAR(b[i].logprobs[t], s[i].logprobs[t], 1e-5) << "token " << t;
        }
      }
    }
    EXPECT_EQ(n_seqs, R == 2 ? 2u : 6u);
  }
}

TEST(EpOverlap, TraceNamesEachExchangeByLayerAndMicroBatch) {
  Tracer tracer(0);
  run_group(2, true, &tracer);
  const std::string path = ::testing::TempDir() + "/ep_overlap_trace.json";
  ASSERT_TRUE(tracer.write(path).ok());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto ck = Checkpoint::open(model_dir());
  ASSERT_TRUE(ck.ok());
  const ModelConfig& c = (*ck)->config();
  int moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int mb = 0; mb < 2; ++mb) {
      EXPECT_NE(text.find(fmt::format("\"attention L{} mb{}\"", l, mb)), std::string::npos);
      if (!c.is_moe_layer(l)) continue;
      for (const char* stage : {"dispatch", "combine", "experts", "gate"}) {
        EXPECT_NE(text.find(fmt::format("\"{} L{} mb{}\"", stage, l, mb)), std::string::npos)
            << stage << " L" << l << " mb" << mb;
      }
    }
    moe_layers += c.is_moe_layer(l);
  }
  EXPECT_GT(moe_layers, 0);
}

// Tokens and logprobs of each request, served by R engines over one in-process group.
struct Served {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool finished = false;
};

std::vector<Served> serve(int R, bool overlap, int n_requests) {
  auto comms = make_in_process_group(R, CommOptions{std::chrono::milliseconds(60000)});
  auto ck = Checkpoint::open(model_dir());
  EXPECT_TRUE(ck.ok());
  const ModelConfig& c = (*ck)->config();
  EpOptions eo;
  eo.dtype = DispatchDType::kF32;
  std::vector<std::unique_ptr<EpDispatcher>> dispatchers;
  for (int r = 0; r < R; ++r) {
    auto d = EpDispatcher::create(*comms[size_t(r)],
                                  *ExpertPlacement::contiguous(c.n_routed_experts, R), eo);
    EXPECT_TRUE(d.ok());
    dispatchers.push_back(std::move(*d));
  }
  EngineOptions o;
  o.model_dir = model_dir();
  o.threads = 1;
  o.kv_cache_gb = 0.05;
  o.max_batch_tokens = 64;  // long prompts prefill in chunks while others decode
  o.kv_dtype = DType::kF32;
  o.overlap = overlap;
  o.overlap_min_tokens = 0;  // every step splits
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < R; ++r) {
    EngineParallel par;
    par.comm = comms[size_t(r)].get();
    par.dispatcher = dispatchers[size_t(r)].get();
    par.idle_heartbeat = std::chrono::milliseconds(20);
    auto e = make_engine(o, &par);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    engines.push_back(std::move(*e));
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Served> out(static_cast<size_t>(n_requests));
  for (int i = 0; i < n_requests; ++i) {
    EngineRequest req;
    req.id = fmt::format("r{}", i);
    for (int t = 0; t < 4 + 31 * i; ++t) req.prompt.push_back((t * 13 + i * 71 + 1) % 1000);
    req.max_tokens = 6;
    req.ignore_eos = true;
    Status st = engines[0]->submit(req, [&, i](const RequestOutput& ro) {
      std::lock_guard<std::mutex> lock(mu);
      for (const GeneratedToken& t : ro.tokens) {
        out[size_t(i)].tokens.push_back(t.id);
        out[size_t(i)].logprobs.push_back(t.logprob);
      }
      if (ro.finished) out[size_t(i)].finished = true;
      cv.notify_all();
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] {
    return std::all_of(out.begin(), out.end(), [](const Served& s) { return s.finished; });
  }));
  lock.unlock();
  engines[0].reset();  // rank 0 first: its stop reaches the others
  engines.clear();
  return out;
}

TEST(EpOverlap, EngineGivesTheSameTokensWithOverlapOnAndOff) {
  for (int R : {2, 4}) {
    auto off = serve(R, false, 5);
    auto on = serve(R, true, 5);
    for (size_t i = 0; i < off.size(); ++i) {
      EXPECT_EQ(on[i].tokens.size(), 6u) << "R=" << R << " request " << i;
      EXPECT_EQ(on[i].tokens, off[i].tokens) << "R=" << R << " request " << i;
      EXPECT_EQ(on[i].logprobs, off[i].logprobs) << "R=" << R << " request " << i;
    }
  }
}

}  // namespace
}  // namespace moeserve
