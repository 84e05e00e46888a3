#include "core/trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace moeserve {
namespace {

TEST(Tracer, WritesCompleteEventsOnComputeAndCommTracks) {
  Tracer t(3);
  { TraceSpan a(&t, "attention", 7); }
  { TraceSpan b(&t, "dispatch", 7, TraceLane::kComm); }
  { TraceSpan none(nullptr, "ignored"); }
  t.add("odd \"name\"\n", TraceLane::kCompute, 1.0, 2.5);
  ASSERT_EQ(t.size(), 3u);
  std::string path = (std::filesystem::path(::testing::TempDir()) / "trace_test.json").string();
  ASSERT_TRUE(t.write(path).ok());
  auto j = nlohmann::json::parse(std::ifstream(path));
  std::vector<nlohmann::json> events;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") events.push_back(e);
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["name"], "attention 7");
  EXPECT_EQ(events[0]["tid"], 0);
  EXPECT_EQ(events[0]["pid"], 3);
  EXPECT_GE(events[0]["dur"].get<double>(), 0.0);
  EXPECT_EQ(events[1]["name"], "dispatch 7");
  EXPECT_EQ(events[1]["tid"], 1);
  EXPECT_EQ(events[2]["name"], "odd \"name\"\n");
  EXPECT_DOUBLE_EQ(events[2]["dur"].get<double>(), 1.5);
  EXPECT_FALSE(t.write("/nonexistent/dir/trace.json").ok());
}

}  // namespace
}  // namespace moeserve
