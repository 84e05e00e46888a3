// The chat page served at / (src/server/web/chat.html, embedded at build time: docs/server.md
// "The web page").
#pragma once

#include <string_view>

namespace moeserve {

std::string_view chat_page_html();

}  // namespace moeserve
