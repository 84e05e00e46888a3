#include "engine/scheduler.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

std::unique_ptr<Sequence> seq(const std::string& id, int n_prompt, int salt = 0) {
  auto s = std::make_unique<Sequence>();
  s->req.id = id;
  for (int i = 0; i < n_prompt; ++i) s->tokens.push_back(i + salt);
  s->n_prompt = n_prompt;
  return s;
}

// Pretends the model ran: completes the plan and appends a token to sequences with logits.
void run_step(Scheduler& sch, const std::vector<ScheduledSeq>& plan) {
  sch.complete(plan);
  for (const ScheduledSeq& p : plan) {
    if (p.want_logits) p.seq->tokens.push_back(7);
  }
}

TEST(Scheduler, ChunksPrefillUnderTheTokenBudget) {
  KvBlockManager blocks(100);
  Scheduler sch({8, 100}, blocks);
  sch.add(seq("a", 250));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].n_tokens, 100);
  EXPECT_FALSE(plan[0].want_logits);
  run_step(sch, plan);
  plan = sch.schedule();
  EXPECT_EQ(plan[0].n_tokens, 100);
  run_step(sch, plan);
  plan = sch.schedule();
  EXPECT_EQ(plan[0].n_tokens, 50);
  EXPECT_TRUE(plan[0].want_logits);
  run_step(sch, plan);
  plan = sch.schedule();  // decode
  EXPECT_EQ(plan[0].n_tokens, 1);
}

TEST(Scheduler, DecodesComeFirstThenAdmissions) {
  KvBlockManager blocks(100);
  Scheduler sch({8, 10}, blocks);
  sch.add(seq("a", 5));
  run_step(sch, sch.schedule());  // a prefilled, now decoding
  sch.add(seq("b", 30));
  auto plan = sch.schedule();
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].seq->req.id, "a");
  EXPECT_EQ(plan[0].n_tokens, 1);
  EXPECT_EQ(plan[1].seq->req.id, "b");
  EXPECT_EQ(plan[1].n_tokens, 9);  // what the budget leaves
}

TEST(Scheduler, RespectsMaxNumSeqs) {
  KvBlockManager blocks(100);
  Scheduler sch({2, 1000}, blocks);
  for (auto id : {"a", "b", "c"}) sch.add(seq(id, 4));
  EXPECT_EQ(sch.schedule().size(), 2u);
  EXPECT_EQ(sch.waiting().size(), 1u);
}

TEST(Scheduler, PreemptsNewestWhenBlocksRunOut) {
  KvBlockManager blocks(4);  // 256 tokens
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
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].seq->req.id, "new");
  EXPECT_EQ(plan[0].n_tokens, int64_t(plan[0].seq->tokens.size()) - plan[0].seq->n_computed);
  EXPECT_TRUE(plan[0].want_logits);
}

TEST(Scheduler, PrefixCacheSkipsComputedBlocks) {
  KvBlockManager blocks(100);
  Scheduler sch({8, 1000}, blocks);
  sch.add(seq("a", 200));
  auto plan = sch.schedule();
  run_step(sch, plan);
  sch.remove(sch.running()[0].get());
  sch.add(seq("b", 200));  // same prompt
  plan = sch.schedule();
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].seq->n_computed, 192);  // three full blocks reused
  EXPECT_EQ(plan[0].n_tokens, 8);
  EXPECT_EQ(sch.prefix_hits(), 192);
  EXPECT_EQ(sch.prefix_queries(), 400);
  // A prompt of exactly whole blocks keeps its last block to compute (its logits are needed).
  sch.remove(sch.running()[0].get());
  sch.add(seq("c", 192));
  plan = sch.schedule();
  EXPECT_EQ(plan[0].seq->n_computed, 128);
  EXPECT_EQ(plan[0].n_tokens, 64);
}

}  // namespace
}  // namespace moeserve
