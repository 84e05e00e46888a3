// API-key check for the /v1 routes: "Authorization: Bearer <key>", compared in constant time so
// the reply time does not reveal how much of a guess was right.
#pragma once

#include <string_view>

namespace moeserve {

// True when a and b are equal. The time taken depends only on the lengths, not the contents.
bool constant_time_equal(std::string_view a, std::string_view b);

// True when `authorization` (the header's value) is "Bearer <expected>" (scheme case-insensitive).
bool bearer_matches(std::string_view authorization, std::string_view expected);

}  // namespace moeserve
