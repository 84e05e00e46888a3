#include "transfer/kv_wire.h"

#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

namespace moeserve {

namespace {

class Writer {
 public:
  void u64(uint64_t v) { put(&v, 8); }
  void i64(int64_t v) { put(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    put(s.data(), s.size());
  }
  void i32s(const std::vector<int32_t>& v) {
    u64(v.size());
    put(v.data(), v.size() * 4);
  }
  void bytes(std::span<const uint8_t> b) { put(b.data(), b.size()); }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  void put(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool u64(uint64_t* v) { return get(v, 8); }
  bool i64(int64_t* v) { return get(v, 8); }
  bool str(std::string* s) {
    uint64_t n = 0;
    if (!u64(&n) || n > left()) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool i32s(std::vector<int32_t>* v) {
    uint64_t n = 0;
    if (!u64(&n) || n > left() / 4) return false;
    v->resize(n);
    return get(v->data(), n * 4);
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  bool get(void* p, size_t n) {
    if (n > left()) return false;
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

MsgType type_of(const KvMessage& m) {
  return std::visit(
      [](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, PullMsg>) return MsgType::kPull;
        if constexpr (std::is_same_v<T, HeaderMsg>) return MsgType::kHeader;
        if constexpr (std::is_same_v<T, BlockMsg>) return MsgType::kBlock;
        if constexpr (std::is_same_v<T, DoneMsg>) return MsgType::kDone;
        if constexpr (std::is_same_v<T, ReleaseMsg>) return MsgType::kRelease;
        return MsgType::kAbort;
      },
      m);
}

std::vector<uint8_t> body_of(const KvMessage& m) {
  Writer w;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, PullMsg>) {
          w.str(v.handle);
          w.u64(v.fingerprint);
          w.u64(v.from_block);
        } else if constexpr (std::is_same_v<T, HeaderMsg>) {
          w.u64(v.fingerprint);
          w.u64(v.block_bytes);
          w.u64(v.n_blocks);
          w.i64(v.n_prompt);
          w.i64(v.n_computed);
          w.i64(v.n_cached_prompt);
          w.i32s(v.tokens);
          w.str(v.rng_state);
        } else if constexpr (std::is_same_v<T, BlockMsg>) {
          w.bytes(v.bytes);
        } else if constexpr (std::is_same_v<T, AbortMsg>) {
          w.u64(v.code);
          w.str(v.reason);
        } else if constexpr (std::is_same_v<T, ReleaseMsg>) {
          w.str(v.handle);
        }
      },
      m);
  return w.take();
}

}  // namespace

FrameHeader frame_header(MsgType type, std::span<const uint8_t> body, uint64_t seq) {
  FrameHeader h;
  h.type = uint16_t(type);
  h.length = body.size();
  h.seq = seq;
  h.checksum = XXH3_64bits(body.data(), body.size());
  return h;
}

std::vector<uint8_t> encode(const KvMessage& m) {
  const std::vector<uint8_t> body = body_of(m);
  const uint64_t seq = std::holds_alternative<BlockMsg>(m) ? std::get<BlockMsg>(m).index : 0;
  const FrameHeader h = frame_header(type_of(m), body, seq);
  std::vector<uint8_t> out(sizeof(h) + body.size());
  std::memcpy(out.data(), &h, sizeof(h));
  if (!body.empty()) std::memcpy(out.data() + sizeof(h), body.data(), body.size());
  return out;
}

Status check_header(const FrameHeader& h, uint64_t max_body) {
  if (h.magic != kKvWireMagic) {
    return InvalidArgument(fmt::format("not a KV transfer frame (magic {:08x})", h.magic));
  }
  if (h.version != kKvWireVersion) {
    return InvalidArgument(fmt::format("KV transfer frame of version {}, this build speaks {}",
                                       h.version, kKvWireVersion));
  }
  if (h.type < uint16_t(MsgType::kPull) || h.type > uint16_t(MsgType::kRelease)) {
    return InvalidArgument(fmt::format("KV transfer frame of unknown type {}", h.type));
  }
  if (h.length > max_body) {
    return InvalidArgument(
        fmt::format("KV transfer frame of {} bytes, more than the {} allowed", h.length, max_body));
  }
  return Status::Ok();
}

Status verify_body(const FrameHeader& h, std::span<const uint8_t> body) {
  if (h.length != body.size()) return InvalidArgument("KV transfer frame of the wrong length");
  if (XXH3_64bits(body.data(), body.size()) != h.checksum) {
    return Corrupt(
        fmt::format("KV transfer frame (type {}, seq {}) fails its checksum", h.type, h.seq));
  }
  return Status::Ok();
}

Result<KvMessage> decode(const FrameHeader& h, std::span<const uint8_t> body) {
  RETURN_IF_ERROR(check_header(h, body.size()));
  RETURN_IF_ERROR(verify_body(h, body));
  Reader r(body);
  bool ok = true;
  KvMessage out;
  switch (MsgType(h.type)) {
    case MsgType::kPull: {
      PullMsg m;
      ok = r.str(&m.handle) && r.u64(&m.fingerprint) && r.u64(&m.from_block);
      out = std::move(m);
      break;
    }
    case MsgType::kHeader: {
      HeaderMsg m;
      ok = r.u64(&m.fingerprint) && r.u64(&m.block_bytes) && r.u64(&m.n_blocks) &&
           r.i64(&m.n_prompt) && r.i64(&m.n_computed) && r.i64(&m.n_cached_prompt) &&
           r.i32s(&m.tokens) && r.str(&m.rng_state);
      out = std::move(m);
      break;
    }
    case MsgType::kBlock: {
      BlockMsg m;
      m.index = h.seq;
      m.bytes.assign(body.begin(), body.end());
      r = Reader({});
      out = std::move(m);
      break;
    }
    case MsgType::kDone:
      out = DoneMsg{};
      break;
    case MsgType::kAbort: {
      AbortMsg m;
      ok = r.u64(&m.code) && r.str(&m.reason) && m.code > 0 &&
           m.code <= uint64_t(StatusCode::kInternal);
      out = std::move(m);
      break;
    }
    case MsgType::kRelease: {
      ReleaseMsg m;
      ok = r.str(&m.handle);
      out = std::move(m);
      break;
    }
  }
  if (!ok || r.left() != 0) {
    return InvalidArgument(fmt::format("malformed KV transfer message of type {}", h.type));
  }
  return out;
}

}  // namespace moeserve
