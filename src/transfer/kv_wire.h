// The KV transfer protocol's messages (docs/pd.md "Wire format"): every message is one frame, a
// fixed 32-byte FrameHeader then `length` body bytes whose XXH3-64 is `checksum`. Integers are
// little-endian. One typed struct per message; encode() and decode() are the only code that
// knows the bytes, and decode() refuses anything malformed with a message (never a crash).
//
//   decode unit (puller)                       prefill unit (holds the hand-off under a lease)
//   PullMsg{handle, fingerprint, from_block} ->
//                                           <- HeaderMsg{counts, tokens, sampler}  | AbortMsg
//                                           <- BlockMsg (seq = from_block .. n_blocks - 1)
//   DoneMsg ->                                 (the lease ends)
//                                           <- DoneMsg
//   AbortMsg at any point, either way: the other side stops and says why.
//
// A pulled hand-off stays held (retained) for failover: a decode unit that takes over a
// re-bound request pulls it again (docs/fault-tolerance.md). Whoever knows the request has
// ended (the router) lets it go on a connection of its own:
//   ReleaseMsg{handle} ->                      (the hand-off is dropped, pulled or not)
//                                           <- DoneMsg
//
// A dropped connection resumes: the puller connects again and asks from the first block it has
// not verified.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"

namespace moeserve {

inline constexpr uint32_t kKvWireMagic = 0x564b534d;  // "MSKV"
inline constexpr uint16_t kKvWireVersion = 1;
// The largest body a peer accepts: a block of DeepSeek-V3 in BF16 with its MTP layer is
// 4.6 MB; a header with a 160K-token context ~0.7 MB.
inline constexpr uint64_t kKvWireMaxBody = uint64_t(64) << 20;

enum class MsgType : uint16_t {
  kPull = 1,
  kHeader = 2,
  kBlock = 3,
  kDone = 4,
  kAbort = 5,
  kRelease = 6,
};

struct FrameHeader {
  uint32_t magic = kKvWireMagic;
  uint16_t version = kKvWireVersion;
  uint16_t type = 0;
  uint64_t length = 0;    // body bytes
  uint64_t seq = 0;       // BlockMsg: the block's index
  uint64_t checksum = 0;  // XXH3-64 of the body
};
static_assert(sizeof(FrameHeader) == 32);

struct PullMsg {
  std::string handle;        // the hand-off's name at the prefill unit (the request id)
  uint64_t fingerprint = 0;  // the puller's KV fingerprint: a mismatch is refused at once
  uint64_t from_block = 0;   // resume: the first block the puller still needs
};

struct HeaderMsg {
  uint64_t fingerprint = 0;
  uint64_t block_bytes = 0;
  uint64_t n_blocks = 0;
  int64_t n_prompt = 0;
  int64_t n_computed = 0;
  int64_t n_cached_prompt = 0;
  std::vector<int32_t> tokens;
  std::string rng_state;
};

struct BlockMsg {
  uint64_t index = 0;
  std::vector<uint8_t> bytes;
};

struct DoneMsg {};

struct AbortMsg {
  uint64_t code = 0;  // a StatusCode: what the other side's error is
  std::string reason;
};

struct ReleaseMsg {
  std::string handle;  // the hand-off to drop: its request has ended
};

using KvMessage = std::variant<PullMsg, HeaderMsg, BlockMsg, DoneMsg, AbortMsg, ReleaseMsg>;

// The header of a frame with this body (a block is sent as this header then its bytes, uncopied).
FrameHeader frame_header(MsgType type, std::span<const uint8_t> body, uint64_t seq = 0);
// The message's frame: header then body.
std::vector<uint8_t> encode(const KvMessage& m);
// A frame header as received: its magic, version, type and length are checked (length against
// max_body).
Status check_header(const FrameHeader& h, uint64_t max_body);
// The body's length and checksum against its checked header (Corrupt on a mismatch).
Status verify_body(const FrameHeader& h, std::span<const uint8_t> body);
// The message of a checked header and its body (checksum, then the body's structure).
Result<KvMessage> decode(const FrameHeader& h, std::span<const uint8_t> body);

}  // namespace moeserve
