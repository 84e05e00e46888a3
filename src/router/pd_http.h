// Small pieces the router and the units share on their HTTP side (docs/pd.md).
#pragma once

#include <string>

#include "core/status.h"
#include "server/reply.h"

namespace moeserve {

// "http://host:port[/...]" (the scheme may be left out) into host and port.
Status split_http_url(const std::string& url, std::string* host, int* port);
// An OpenAI-style error reply for a Status (api_error.h's mapping of codes to HTTP statuses).
Reply error_reply(const Status& st);

}  // namespace moeserve
