#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include "../cache/tier_test_util.h"

namespace moeserve {
namespace {

std::unique_ptr<Sequence> seq(const std::string& id, int n_prompt, int salt = 0) {
  auto s = std::make_unique<Sequence>();
  s->req.id = id;
  for (int i = 0; i < n_prompt; ++i) s->tokens.push_back(i + salt);
  s->n_prompt = n_prompt;
  return s;
}

KvCache cache(int32_t blocks) {
  return KvCache({1, {DType::kF32, 1, 0}}, blocks);
}

// Pretends the model ran and sampled token 7 for sequences with logits; commits the step.
StepResult sampled(const StepPlan& plan) {
  StepResult r;
  r.seqs.resize(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (plan.seqs[i].n_logits > 0) r.seqs[i].tokens.push_back({7, 0.0f, {}});
  }
  return r;
}
void run_step(Scheduler& sch, const StepPlan& plan) {
  sch.commit(plan, sampled(plan));
}

TEST(Scheduler, ChunksPrefillUnderTheTokenBudget) {
  KvCache blocks = cache(100);
  Scheduler sch({8, 100}, blocks);
  sch.add(seq("a", 250));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].n_tokens, 100);
  EXPECT_EQ(plan.seqs[0].n_logits, 0);
  run_step(sch, plan);
  plan = sch.schedule();
  EXPECT_EQ(plan.seqs[0].n_tokens, 100);
  run_step(sch, plan);
  plan = sch.schedule();
  EXPECT_EQ(plan.seqs[0].n_tokens, 50);
  EXPECT_EQ(plan.seqs[0].n_logits, 1);
  run_step(sch, plan);
  plan = sch.schedule();  // decode
  EXPECT_EQ(plan.seqs[0].n_tokens, 1);
}

TEST(Scheduler, DecodesComeFirstThenAdmissions) {
  KvCache blocks = cache(100);
  Scheduler sch({8, 10}, blocks);
  sch.add(seq("a", 5));
  run_step(sch, sch.schedule());  // a prefilled, now decoding
  sch.add(seq("b", 30));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[0].seq->req.id, "a");
  EXPECT_EQ(plan.seqs[0].n_tokens, 1);
  EXPECT_EQ(plan.seqs[1].seq->req.id, "b");
  EXPECT_EQ(plan.seqs[1].n_tokens, 9);  // what the budget leaves
}

TEST(Scheduler, RespectsMaxNumSeqs) {
  KvCache blocks = cache(100);
  Scheduler sch({2, 1000}, blocks);
  for (auto id : {"a", "b", "c"}) sch.add(seq(id, 4));
  EXPECT_EQ(sch.schedule().seqs.size(), 2u);
  EXPECT_EQ(sch.waiting().size(), 1u);
}

TEST(Scheduler, PreemptsNewestWhenBlocksRunOut) {
  KvCache blocks = cache(4);  // 256 tokens
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("old", 120, 0));
  sch.add(seq("new", 120, 1000));
  run_step(sch, sch.schedule());  // 2 blocks each, both now at 121 tokens
  // Decode until "old" needs a third block: "new" gets preempted and "old" keeps going.
  int64_t preempted_at = -1;
  for (int step = 0; step < 10 && preempted_at < 0; ++step) {
    auto plan = sch.schedule();
    if (sch.preemptions() > 0) preempted_at = step;
    run_step(sch, plan);
  }
  ASSERT_GE(preempted_at, 0);
  EXPECT_EQ(sch.running().size(), 1u);
  EXPECT_EQ(sch.running()[0]->req.id, "old");
  ASSERT_EQ(sch.waiting().size(), 1u);
  EXPECT_EQ(sch.waiting()[0]->n_computed, 0);
  EXPECT_TRUE(sch.waiting()[0]->block_table.empty());
  // Finishing "old" lets "new" back in, recomputing its prompt and generated tokens.
  sch.remove(sch.running()[0].get());
  auto plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].seq->req.id, "new");
  EXPECT_EQ(plan.seqs[0].n_tokens,
            int64_t(plan.seqs[0].seq->tokens.size()) - plan.seqs[0].seq->n_computed);
  EXPECT_EQ(plan.seqs[0].n_logits, 1);
}

TEST(Scheduler, PrefixCacheSkipsComputedBlocks) {
  KvCache blocks = cache(100);
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("a", 200));
  auto plan = sch.schedule();
  run_step(sch, plan);
  sch.remove(sch.running()[0].get());
  sch.add(seq("b", 200));  // same prompt
  plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].seq->n_computed, 192);  // three full blocks reused
  EXPECT_EQ(plan.seqs[0].n_tokens, 8);
  EXPECT_EQ(sch.prefix_hits(), 192);
  EXPECT_EQ(sch.prefix_queries(), 400);
  // A prompt of exactly whole blocks keeps its last block to compute (its logits are needed).
  sch.remove(sch.running()[0].get());
  sch.add(seq("c", 192));
  plan = sch.schedule();
  EXPECT_EQ(plan.seqs[0].seq->n_computed, 128);
  EXPECT_EQ(plan.seqs[0].n_tokens, 64);
}

// Another process's run: prefills prompt "x" of n tokens; its full blocks land in the tier.
void prefill_into(MapTier& tier, int n) {
  KvCache first = cache(10);
  tier.keep_registered = true;
  first.set_tier(&tier);
  Scheduler sch({8, 1000}, first);
  sch.add(seq("x", n));
  run_step(sch, sch.schedule());
  sch.remove(sch.running()[0].get());
  tier.keep_registered = false;
}

// The lower tier: a restarted cache finds the prompt's blocks there. The sequence waits in
// loading KV (no tokens planned, blocks reserved) while others step; once the load finishes it
// prefills only what was not loaded.
TEST(Scheduler, LoadingKvWaitsInItsOwnStateWhileOthersStep) {
  MapTier tier;
  prefill_into(tier, 200);
  EXPECT_EQ(tier.blocks.size(), 3u);
  KvCache blocks = cache(100);
  blocks.set_tier(&tier);
  tier.hold = true;
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("b", 5, 1000));
  run_step(sch, sch.schedule());  // b decodes from now on
  sch.add(seq("x", 200));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].seq->req.id, "b");
  ASSERT_EQ(sch.loading().size(), 1u);
  Sequence* x = sch.loading()[0].get();
  EXPECT_EQ(x->state(), SeqState::kLoadingKv);
  EXPECT_EQ(x->block_table.size(), 3u);  // reserved for the three full blocks
  EXPECT_TRUE(sch.has_work());
  run_step(sch, plan);
  plan = sch.schedule();  // still loading
  ASSERT_EQ(plan.seqs.size(), 1u);
  run_step(sch, plan);
  tier.release_loads();
  plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[1].seq, x);
  EXPECT_EQ(x->state(), SeqState::kPrefill);
  EXPECT_EQ(x->n_computed, 192);
  EXPECT_EQ(plan.seqs[1].n_tokens, 8);
  EXPECT_EQ(plan.seqs[1].n_logits, 1);
  EXPECT_EQ(sch.prefix_hits(), 192);
  EXPECT_EQ(sch.prefix_hits_lower(), 192);
  EXPECT_EQ(x->n_cached_prompt, 192);
}

// Requests sharing a prompt after a restart: one reads it from the tier, the others wait in the
// queue (a request behind them passes) and then find it in RAM.
TEST(Scheduler, ABlockBeingLoadedIsReadOnceForEveryoneWhoWantsIt) {
  MapTier tier;
  prefill_into(tier, 200);
  KvCache blocks = cache(100);
  blocks.set_tier(&tier);
  tier.hold = true;
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("x1", 200));
  sch.add(seq("x2", 200));
  sch.add(seq("other", 10, 500));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);  // "other" passed x2
  EXPECT_EQ(plan.seqs[0].seq->req.id, "other");
  EXPECT_EQ(sch.loading().size(), 1u);
  ASSERT_EQ(sch.waiting().size(), 1u);
  EXPECT_EQ(sch.waiting()[0]->req.id, "x2");
  EXPECT_TRUE(sch.waiting()[0]->block_table.empty());  // holds nothing while it waits
  EXPECT_EQ(tier.held.size(), 1u);
  run_step(sch, plan);
  tier.release_loads();
  plan = sch.schedule();  // x1 in from the tier, x2 admitted from RAM
  ASSERT_EQ(plan.seqs.size(), 3u);
  EXPECT_EQ(plan.seqs[1].seq->req.id, "x1");
  EXPECT_EQ(plan.seqs[2].seq->req.id, "x2");
  EXPECT_EQ(plan.seqs[2].seq->n_computed, 192);
  EXPECT_TRUE(tier.held.empty());  // no second load
  EXPECT_EQ(sch.prefix_hits(), 384);
  EXPECT_EQ(sch.prefix_hits_lower(), 192);  // x1's; x2's hits came from RAM
}

TEST(Scheduler, ASequenceRemovedWhileLoadingFreesItsBlocksWhenTheLoadEnds) {
  MapTier tier;
  prefill_into(tier, 130);
  KvCache blocks = cache(10);
  blocks.set_tier(&tier);
  tier.hold = true;
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("x", 130));
  EXPECT_TRUE(sch.schedule().empty());
  ASSERT_EQ(sch.loading().size(), 1u);
  EXPECT_FALSE(sch.has_work());  // nothing to do until the load finishes
  auto gone = sch.remove(sch.loading()[0].get());
  EXPECT_EQ(gone->state(), SeqState::kFinished);
  EXPECT_TRUE(sch.idle());
  EXPECT_EQ(blocks.num_available(), 8);  // the tier may still write into two of them
  tier.release_loads();
  EXPECT_EQ(blocks.loads_in_flight(), 0);
  EXPECT_EQ(blocks.num_available(), 10);
}

// await_loads (a fixed batch in lockstep): the load finishes inside schedule(), which plans
// the sequence at once.
TEST(Scheduler, AwaitLoadsPlansTheLoadedSequenceInTheSameStep) {
  MapTier tier;
  prefill_into(tier, 130);
  KvCache blocks = cache(10);
  blocks.set_tier(&tier);
  SchedulerConfig config{8, 1000};
  config.await_loads = true;
  Scheduler sch(config, blocks);
  sch.add(seq("x", 130));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].seq->n_computed, 128);
  EXPECT_EQ(plan.seqs[0].n_tokens, 2);
}

TEST(Scheduler, StatesFollowTheDiagram) {
  KvCache blocks = cache(4);
  Scheduler sch({8, 100}, blocks);
  sch.add(seq("a", 150));
  Sequence* a = sch.waiting()[0].get();
  EXPECT_EQ(a->state(), SeqState::kWaiting);
  run_step(sch, sch.schedule());  // 100 of 150 prompt tokens
  EXPECT_EQ(a->state(), SeqState::kPrefill);
  run_step(sch, sch.schedule());  // the rest: samples its first token
  EXPECT_EQ(a->state(), SeqState::kDecode);
  std::unique_ptr<Sequence> gone = sch.remove(a);
  EXPECT_EQ(gone->state(), SeqState::kFinished);
  EXPECT_FALSE(is_valid_transition(SeqState::kFinished, SeqState::kPrefill));
  EXPECT_FALSE(is_valid_transition(SeqState::kWaiting, SeqState::kDecode));
  EXPECT_TRUE(is_valid_transition(SeqState::kDecode, SeqState::kWaiting));  // preemption
}

// A prefill chunk that leaves exactly one prompt token is still a prefill: its next chunk is
// scheduled after the decodes, and it samples nothing until the prompt is done.
TEST(Scheduler, OneTokenLeftOfThePromptIsNotADecode) {
  KvCache blocks = cache(8);
  Scheduler sch({8, 9}, blocks);
  sch.add(seq("d", 3));
  run_step(sch, sch.schedule());  // d: prompt done, decoding
  sch.add(seq("p", 9));
  StepPlan plan = sch.schedule();  // d 1 token, p 8 of its 9
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[1].n_tokens, 8);
  EXPECT_EQ(plan.seqs[1].n_logits, 0);
  run_step(sch, plan);
  Sequence* p = sch.running()[1].get();
  EXPECT_EQ(p->n_uncomputed(), 1);
  EXPECT_EQ(p->state(), SeqState::kPrefill);
  plan = sch.schedule();
  EXPECT_EQ(plan.seqs[0].seq->req.id, "d");
  EXPECT_EQ(plan.seqs[1].seq, p);
  EXPECT_EQ(plan.seqs[1].n_logits, 1);
}

TEST(Scheduler, MaxChunkTokensCapsEachSequence) {
  KvCache blocks = cache(8);
  Scheduler sch({8, 1000, /*max_chunk_tokens=*/7}, blocks);
  sch.add(seq("a", 20));
  sch.add(seq("b", 5));
  StepPlan plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[0].n_tokens, 7);
  EXPECT_EQ(plan.seqs[1].n_tokens, 5);
  EXPECT_EQ(plan.seqs[1].n_logits, 1);
}

// Drafts: commit keeps the KV of accepted drafts only, and registers a block only once all its
// tokens are final.
TEST(Scheduler, CommitRollsBackRejectedDrafts) {
  KvCache blocks = cache(8);
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("a", 62));
  run_step(sch, sch.schedule());  // 62 computed, token 7 sampled (63 tokens)
  Sequence* a = sch.running()[0].get();
  StepPlan plan = sch.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  // Verify three drafts after the sampled token: positions 62..65 cross into block 1.
  plan.seqs[0].drafts = {7, 8, 9};
  plan.seqs[0].n_logits = 4;
  ASSERT_EQ(blocks_for(66), 2);
  ASSERT_TRUE(blocks.allocate(1, &a->block_table));  // the runner's room for the drafts
  StepResult r;
  r.seqs.resize(1);
  r.seqs[0].n_accepted_drafts = 1;                    // draft 7 right, 8 wrong
  r.seqs[0].tokens = {{7, 0.0f, {}}, {5, 0.0f, {}}};  // accepted draft + the correction
  sch.commit(plan, r);
  EXPECT_EQ(a->n_computed, 64);  // 62 + the planned token + one accepted draft
  EXPECT_EQ(a->tokens.size(), 65u);
  EXPECT_EQ(a->tokens[63], 7);
  EXPECT_EQ(a->tokens[64], 5);
  EXPECT_EQ(blocks.cached_blocks(), 1);  // block 0 is final; block 1 holds rejected KV
  EXPECT_EQ(a->block_hashes.size(), 1u);
}

}  // namespace
}  // namespace moeserve
