// The HTTP messages between the router and its units (docs/pd.md "Control"): JSON bodies on
// internal routes, separate from the OpenAI API and never through MPI. Each struct has one
// to_json and one from_json; from_json refuses a malformed body with a message.
//
//   unit -> router   POST /pd/v1/register    UnitInfo          (and again on every restart)
//   unit -> router   POST /pd/v1/heartbeat   UnitLoad          (every heartbeat interval)
//   unit -> router   POST /pd/v1/deregister  {"name"}          (drained, leaving)
//   router -> unit   POST /pd/v1/prefill     PdRequest         -> PrefillReply
//   router -> unit   POST /pd/v1/decode      PdRequest + KV source -> NDJSON RequestOutput lines
//   router -> unit   POST /pd/v1/attach      {"key"}           -> the same lines, from the start,
//                                                                 of the keyed request (404: none)
//   router -> unit   POST /pd/v1/cancel      {"key"}           (the client cancelled it)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "engine/engine.h"

namespace moeserve {

enum class UnitRole { kPrefill, kDecode, kBoth };
std::string_view to_string(UnitRole r);
Result<UnitRole> parse_unit_role(std::string_view s);

struct UnitInfo {
  std::string name;  // unique among the router's units ("host:port" of its HTTP side)
  std::string url;   // http://host:port of the unit's internal routes
  UnitRole role = UnitRole::kBoth;
  std::string transfer;      // "host:port" of its KV transfer server (prefill side)
  uint64_t fingerprint = 0;  // its KV fingerprint: prefill and decode units must agree
  int64_t ranks = 1;         // DP-attention ranks
  int64_t kv_blocks_total = 0;
};

struct UnitLoad {
  std::string name;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t leases = 0;  // hand-offs held for decode units
  bool draining = false;
};

// An engine request as the router sends it to a unit (the hand-off travels by KV transfer).
struct PdRequest {
  EngineRequest request;  // resume and hand_off are not sent: the route says which
  std::string transfer;   // decode: the prefill unit's KV transfer server ("host:port")
  std::string handle;     // decode: the hand-off's name there
  // decode, a keyed request: what the client had before this unit (the hand-off's first token,
  // a re-bound request's tokens), where the outputs a router attaches to begin.
  std::optional<RequestOutput> before;
};

struct PrefillReply {
  RequestOutput output;  // finished: with kHandedOff the request goes on at a decode unit
  std::string transfer;  // with kHandedOff: where to pull the KV
  std::string handle;
};

nlohmann::json to_json(const UnitInfo& u);
Result<UnitInfo> unit_info_from_json(const nlohmann::json& j);
nlohmann::json to_json(const UnitLoad& l);
Result<UnitLoad> unit_load_from_json(const nlohmann::json& j);
nlohmann::json to_json(const PdRequest& r);
Result<PdRequest> pd_request_from_json(const nlohmann::json& j);
// Outputs (tokens with their logprobs, exactly: floats survive the round trip).
nlohmann::json to_json(const RequestOutput& o);
Result<RequestOutput> request_output_from_json(const nlohmann::json& j);
nlohmann::json to_json(const PrefillReply& r);
Result<PrefillReply> prefill_reply_from_json(const nlohmann::json& j);

// A body as JSON (InvalidArgument naming `what` when it does not parse).
Result<nlohmann::json> parse_json(std::string_view body, std::string_view what);

}  // namespace moeserve
