// ExpertLoadStats (moving window of routed tokens) and the loads file formats.
#include "eplb/load_stats.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "eplb/expert_loads.h"

namespace moeserve::eplb {
namespace {

TEST(ExpertLoadStats, CountsRoutedTokensPerLayerAndExpert) {
  ExpertLoadStats s(2, 4, 10);
  const std::vector<int32_t> topk = {0, 3, 3, 1, 3, 0};  // [3 tokens, top-2]
  s.add_routed(1, topk);
  s.add(0, 2, 5);
  EXPECT_EQ(s.steps_in_window(), 0);
  EXPECT_EQ(s.window_totals().tokens, std::vector<double>(8, 0.0)) << "open step not counted";
  s.end_step();
  EXPECT_EQ(s.window_totals().tokens, (std::vector<double>{0, 0, 5, 0, 2, 1, 0, 3}));
  EXPECT_EQ(s.steps_in_window(), 1);
}

TEST(ExpertLoadStats, MovingAverageOverTheLastWindowSteps) {
  ExpertLoadStats s(1, 2, 3);
  for (int step = 1; step <= 5; ++step) {  // step k routes k tokens to expert 0, 1 to expert 1
    s.add(0, 0, step);
    s.add(0, 1, 1);
    s.end_step();
  }
  EXPECT_EQ(s.steps_in_window(), 3);
  EXPECT_EQ(s.steps_completed(), 5);
  EXPECT_EQ(s.window_totals().tokens, (std::vector<double>{3 + 4 + 5, 3}));
  EXPECT_EQ(s.moving_average().tokens, (std::vector<double>{4, 1}));
}

TEST(ExpertLoadStats, SeedCountsAsItsStepsAndLeavesAsOneBlock) {
  ExpertLoadStats s(1, 2, 4);
  ExpertLoads saved(1, 2);
  saved.at(0, 0) = 30;
  saved.at(0, 1) = 6;
  ASSERT_TRUE(s.seed(saved, 3).ok());
  EXPECT_EQ(s.steps_in_window(), 3);
  EXPECT_EQ(s.moving_average().tokens, (std::vector<double>{10, 2}));
  s.add(0, 1, 4);
  s.end_step();  // 3 seeded + 1 real = 4 = window
  EXPECT_EQ(s.window_totals().tokens, (std::vector<double>{30, 10}));
  s.add(0, 1, 4);
  s.end_step();  // no room: the whole seed leaves
  EXPECT_EQ(s.steps_in_window(), 2);
  EXPECT_EQ(s.window_totals().tokens, (std::vector<double>{0, 8}));
}

TEST(ExpertLoadStats, SeedRejectsWrongShapeOrSteps) {
  ExpertLoadStats s(2, 4, 8);
  EXPECT_FALSE(s.seed(ExpertLoads(2, 5), 1).ok());
  EXPECT_FALSE(s.seed(ExpertLoads(2, 4), 0).ok());
  EXPECT_FALSE(s.seed(ExpertLoads(2, 4), 9).ok());
  ExpertLoads huge(2, 4);
  huge.at(1, 3) = 1e19;  // past int64 token counters
  EXPECT_FALSE(s.seed(huge, 1).ok());
  EXPECT_TRUE(s.seed(ExpertLoads(2, 4), 8).ok());
}

TEST(ExpertLoadStats, FileRoundTripsThroughReadLoadFile) {
  ExpertLoadStats s(2, 3, 16);
  s.add(0, 0, 7);
  s.add(1, 2, 11);
  s.end_step();
  s.add(0, 1, 2);
  s.end_step();
  const std::string path =
      (std::filesystem::temp_directory_path() / "moeserve_eplb_stats_test.json").string();
  ASSERT_TRUE(s.write(path).ok());
  auto file = read_load_file(path);
  std::remove(path.c_str());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->loads.num_layers, 2);
  EXPECT_EQ(file->loads.num_experts, 3);
  EXPECT_EQ(file->loads.tokens, (std::vector<double>{7, 2, 0, 0, 0, 11}));
  ASSERT_TRUE(file->steps.has_value());
  EXPECT_EQ(*file->steps, 2);
  // A fresh accumulator can start from it (--eplb-init).
  ExpertLoadStats restored(2, 3, 16);
  ASSERT_TRUE(restored.seed(file->loads, *file->steps).ok());
  EXPECT_EQ(restored.window_totals().tokens, s.window_totals().tokens);
}

TEST(LoadFile, PlainMatrix) {
  auto f = parse_load_file("[[1, 2.5, 0], [4, 5, 6]]", "m.json");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->loads.num_layers, 2);
  EXPECT_EQ(f->loads.num_experts, 3);
  EXPECT_EQ(f->loads.at(0, 1), 2.5);
  EXPECT_FALSE(f->steps.has_value());
}

TEST(LoadFile, RejectsMalformedInputWithTheReason) {
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"[[1, 2], [3]]", "layer 1 has 1 experts"}, Bad{"[[1, -2]]", "must be finite and >= 0"},
        Bad{"[]", "at least one layer"}, Bad{"[[]]", "at least one layer"},
        Bad{"[[1, \"x\"]]", "not a number"}, Bad{"[1, 2]", "not an array"},
        Bad{"{\"tokens\": [[1]]}", "format"},
        Bad{"{\"format\": \"moeserve.expert_stats\", \"version\": 9}", "version"},
        Bad{"{\"format\": \"moeserve.expert_stats\", \"version\": 1, \"num_layers\": 2,"
            " \"num_experts\": 1, \"steps\": 1, \"tokens\": [[1]]}",
            "num_layers"},
        Bad{"{\"format\": \"moeserve.expert_stats\", \"version\": 1, \"num_layers\": 1,"
            " \"num_experts\": 1, \"tokens\": [[1]]}",
            "steps"},
        Bad{"[[1, 2]", "not valid JSON"}}) {
    auto f = parse_load_file(b.text, "f.json");
    ASSERT_FALSE(f.ok()) << b.text;
    EXPECT_NE(f.status().message().find(b.says), std::string::npos)
        << b.text << " -> " << f.status().message();
    EXPECT_NE(f.status().message().find("f.json"), std::string::npos) << "names the file";
  }
}

TEST(LoadFile, MissingFileIsIOError) {
  auto f = read_load_file("/nonexistent/dir/loads.json");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace moeserve::eplb
