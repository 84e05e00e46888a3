// StopMatcher, ReasoningSplitter and ChoiceOutput: stop strings and <think> tags found across
// piece boundaries, held-back text released at the end, nothing after a stop.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/choice_output.h"
#include "server/reasoning_splitter.h"
#include "server/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    auto t = Tokenizer::load("assets/tokenizer/deepseek-v3");
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }();
  return tok;
}

// Feeds `pieces` through a matcher; returns the released text and whether it stopped.
std::pair<std::string, bool> run_stop(std::vector<std::string> stops,
                                      const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  std::string out;
  bool stopped = false;
  for (const auto& p : pieces) {
    auto s = m.push(p);
    out += s.text;
    if (s.stopped) stopped = true;
  }
  out += m.finish();
  return {out, stopped};
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, MatchInsideOnePieceCutsBeforeIt) {
  auto [out, stopped] = run_stop({"STOP"}, {"hello STOP world"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hello ");
}

TEST(StopMatcher, MatchAcrossPieceBoundaries) {
  auto [out, stopped] = run_stop({"STOP"}, {"hello S", "T", "OP tail", "more"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hello ");
}

TEST(StopMatcher, PartialMatchThatFailsIsReleased) {
  StopMatcher m({"STOP"});
  auto a = m.push("abc ST");
  EXPECT_EQ(a.text, "abc ");  // "ST" held back
  auto b = m.push("ART");
  EXPECT_FALSE(b.stopped);
  EXPECT_EQ(b.text, "START");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, HeldBackTailIsReleasedAtFinish) {
  auto [out, stopped] = run_stop({"STOP"}, {"abc", " STO"});
  EXPECT_FALSE(stopped);
  EXPECT_EQ(out, "abc STO");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  auto [out, stopped] = run_stop({"world", "lo w"}, {"hel", "lo wor", "ld"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "hel");
}

TEST(StopMatcher, NothingAfterAStop) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.push("ax").stopped);
  auto after = m.push("more");
  EXPECT_FALSE(after.stopped);
  EXPECT_EQ(after.text, "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, MultiByteStopAcrossPieces) {
  auto [out, stopped] = run_stop({"终止"}, {"好的", "终", "止了"});
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "好的");
}

std::pair<std::string, std::string> run_reasoning(bool starts_in,
                                                  const std::vector<std::string>& pieces) {
  ReasoningSplitter s(starts_in);
  std::string r, c;
  for (const auto& p : pieces) {
    auto parts = s.push(p);
    r += parts.reasoning;
    c += parts.content;
  }
  auto parts = s.finish();
  return {r + parts.reasoning, c + parts.content};
}

TEST(ReasoningSplitter, ThinkBlockOpenedByTheModel) {
  auto [r, c] = run_reasoning(false, {"<th", "ink>\nLet me", " think</th", "ink>\n\nThe answer"});
  EXPECT_EQ(r, "\nLet me think");
  EXPECT_EQ(c, "\n\nThe answer");
}

TEST(ReasoningSplitter, ThinkBlockOpenedByThePrompt) {
  auto [r, c] = run_reasoning(true, {"hmm", "</think>", "42"});
  EXPECT_EQ(r, "hmm");
  EXPECT_EQ(c, "42");
}

TEST(ReasoningSplitter, NoThinkTagIsAllContent) {
  auto [r, c] = run_reasoning(false, {"<t", "able>x</think>"});
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "<table>x</think>");
}

TEST(ReasoningSplitter, UnclosedReasoningStaysReasoning) {
  auto [r, c] = run_reasoning(true, {"still thinking </thi"});
  EXPECT_EQ(r, "still thinking </thi");
  EXPECT_EQ(c, "");
}

TEST(ReasoningSplitter, ShortOutputThatMightHaveBeenATagIsContent) {
  auto [r, c] = run_reasoning(false, {"<th"});
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "<th");
}

std::vector<GeneratedToken> as_tokens(const std::vector<int32_t>& ids) {
  std::vector<GeneratedToken> out;
  for (int32_t id : ids) out.push_back({id, -1.0f, {}});
  return out;
}

TEST(ChoiceOutput, StopStringSpanningTokensEndsTheChoice) {
  const Tokenizer& tok = tokenizer();
  std::vector<int32_t> ids = tok.encode("The answer is forty-two, said the machine.", false);
  const std::string stop = "forty-two";
  // The stop string must straddle tokens for this test to mean anything.
  for (int32_t id : ids)
    ASSERT_EQ(tok.decode(std::vector<int32_t>{id}, true).find(stop), std::string::npos);
  ChoiceOutput c(tok, {stop}, {});
  std::string text;
  size_t fed = 0;
  for (int32_t id : ids) {  // one token per engine callback
    ChoiceDelta d = c.on_tokens(as_tokens({id}));
    ++fed;
    text += d.content;
    if (d.finish_reason) break;
  }
  EXPECT_TRUE(c.stopped_by_string());
  EXPECT_EQ(c.finish_reason(), "stop");
  EXPECT_EQ(text, "The answer is ");
  EXPECT_LT(fed, ids.size());
  EXPECT_EQ(c.completion_tokens(), int64_t(fed));
  // Later outputs (the engine had not seen the cancel yet) change nothing.
  EXPECT_EQ(c.on_tokens(as_tokens({ids.back()})).content, "");
  EXPECT_FALSE(c.on_finish(FinishReason::kCancelled).finish_reason.has_value());
}

TEST(ChoiceOutput, TextEqualsDecodeWithoutStops) {
  const Tokenizer& tok = tokenizer();
  const std::string text = "Grüße, 世界! 🎉 done";
  std::vector<int32_t> ids = tok.encode(text, false);
  ChoiceOutput c(tok, {}, {});
  std::string out;
  for (int32_t id : ids) out += c.on_tokens(as_tokens({id})).content;
  ChoiceDelta last = c.on_finish(FinishReason::kLength);
  out += last.content;
  EXPECT_EQ(out, text);
  EXPECT_EQ(last.finish_reason, "length");
  EXPECT_EQ(c.completion_tokens(), int64_t(ids.size()));
}

TEST(ChoiceOutput, SpecialTokensAreNotText) {
  const Tokenizer& tok = tokenizer();
  ASSERT_TRUE(tok.eos_id().has_value());
  std::vector<int32_t> ids = tok.encode("ok", false);
  ids.push_back(*tok.eos_id());
  ChoiceOutput c(tok, {}, {});
  std::string out = c.on_tokens(as_tokens(ids)).content;
  ChoiceDelta last = c.on_finish(FinishReason::kStop);
  EXPECT_EQ(out + last.content, "ok");
  EXPECT_EQ(last.finish_reason, "stop");
}

TEST(ChoiceOutput, ReasoningSplitWithStopInTheAnswer) {
  const Tokenizer& tok = tokenizer();
  std::vector<int32_t> ids = tok.encode("<think>\nweigh it</think>\n\nYes. END ignored", false);
  ChoiceOutput c(tok, {"END"}, {true, false});
  std::string r, text;
  for (int32_t id : ids) {
    ChoiceDelta d = c.on_tokens(as_tokens({id}));
    r += d.reasoning;
    text += d.content;
  }
  EXPECT_EQ(r, "\nweigh it");
  EXPECT_EQ(text, "\n\nYes. ");
  EXPECT_EQ(c.finish_reason(), "stop");
}

}  // namespace
}  // namespace moeserve
