// Messages between the front rank (rank 0, which hosts the HTTP API) and the other ranks of a
// data-parallel-attention deployment (docs/ep-serving.md).
//
// Once per engine step every rank takes part in one control exchange over the EP group's
// Communicator (exchange_control): rank 0 sends each rank the requests it assigned to it, the
// cancellations of that rank's requests and the stop flag; every other rank sends rank 0 the
// outputs its requests produced since the last exchange and its statistics. The encoding is
// little-endian binary with explicit lengths; decoding checks every length against the buffer
// and returns Corrupt instead of reading past it (a peer may be a different build).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "ep/communicator.h"

namespace moeserve {

// Rank 0 -> rank r.
struct FrontMessage {
  bool stop = false;                    // leave the step loop after this exchange
  std::vector<EngineRequest> requests;  // newly assigned to rank r (seed always set)
  std::vector<std::string> cancels;     // ids of rank r's requests
  friend bool operator==(const FrontMessage&, const FrontMessage&) = default;
};

// Rank r -> rank 0.
struct RankMessage {
  std::vector<std::pair<std::string, RequestOutput>> outputs;  // in callback order
  EngineStats stats;
  friend bool operator==(const RankMessage&, const RankMessage&) = default;
};

std::vector<uint8_t> encode(const FrontMessage& m);
std::vector<uint8_t> encode(const RankMessage& m);
Result<FrontMessage> decode_front(std::span<const uint8_t> bytes);
Result<RankMessage> decode_rank(std::span<const uint8_t> bytes);

// One collective exchange of byte messages: to_peer[p] goes to rank p (to_peer.size() ==
// comm.size(); the entry for this rank is ignored). Returns from_peer[p] (this rank's entry
// empty). Two collectives: the sizes go round first, then the bytes.
Result<std::vector<std::vector<uint8_t>>> exchange_control(
    Communicator& comm, const std::vector<std::vector<uint8_t>>& to_peer);

}  // namespace moeserve
