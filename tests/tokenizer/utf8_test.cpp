// Invalid UTF-8: encode() replaces each maximal invalid subpart by U+FFFD, exactly as Python's
// bytes.decode("utf-8", "replace") does before HF sees the text; never a crash.
#include <gtest/gtest.h>

#include "fixtures.h"
#include "tokenizer/utf8.h"

namespace moeserve {
namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST(InvalidUtf8, EncodesLikeHuggingFaceOnThePythonRepairedText) {
  const Tokenizer& tok = testing::deepseek_v3();
  const auto rows = testing::read_jsonl(std::string(testing::kDataDir) + "/invalid_utf8.jsonl");
  ASSERT_GE(rows.size(), 100u);
  size_t invalid = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string bytes = from_hex(rows[i]["hex"].get<std::string>());
    if (!utf8::is_valid(bytes)) ++invalid;
    EXPECT_EQ(utf8::lossy(bytes), rows[i]["repaired"].get<std::string>()) << "row " << i;
    EXPECT_EQ(tok.encode(bytes, false), rows[i]["ids"].get<std::vector<int32_t>>()) << "row " << i;
  }
  EXPECT_GE(invalid, 90u);
}

TEST(InvalidUtf8, FirstInvalidPointsAtTheOffendingByte) {
  EXPECT_EQ(utf8::first_invalid("plain ascii"), std::nullopt);
  EXPECT_EQ(utf8::first_invalid("caf\xC3\xA9"), std::nullopt);
  EXPECT_EQ(utf8::first_invalid("abc\xFF"), 3u);
  EXPECT_EQ(utf8::first_invalid("ab\xED\xA0\x80"), 2u);    // surrogate
  EXPECT_EQ(utf8::first_invalid("\xC0\x80"), 0u);          // overlong
  EXPECT_EQ(utf8::first_invalid("12345678\xE2\x82"), 8u);  // truncated after the fast path
  EXPECT_EQ(utf8::first_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
}

TEST(InvalidUtf8, SettledPrefixHoldsBackOnlyATruncatedTail) {
  EXPECT_EQ(utf8::settled_prefix_length("ab"), 2u);
  EXPECT_EQ(utf8::settled_prefix_length("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8::settled_prefix_length("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::settled_prefix_length("ab\xE0\x80"), 4u);  // already invalid: settled
  EXPECT_EQ(utf8::settled_prefix_length("\xFF"), 1u);
  EXPECT_EQ(utf8::settled_prefix_length("\xC3"), 0u);
}

}  // namespace
}  // namespace moeserve
