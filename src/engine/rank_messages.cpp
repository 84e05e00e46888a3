#include "engine/rank_messages.h"

#include <cstring>

#include <fmt/format.h>

namespace moeserve {

namespace {

constexpr uint32_t kFrontMagic = 0x4d534632;  // "MSF2" (2: hand-off fields)
constexpr uint32_t kRankMagic = 0x4d535232;   // "MSR2"

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out_.insert(out_.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

// Reads what Writer wrote; the first overrun makes ok() false and every later read a zero.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  T get() {
    T v{};
    if (!take(sizeof(T))) return v;
    std::memcpy(&v, b_.data() + pos_ - sizeof(T), sizeof(T));
    return v;
  }
  std::string str() {
    uint64_t n = get<uint64_t>();
    if (!take(n)) return {};
    return std::string(reinterpret_cast<const char*>(b_.data() + pos_ - n), size_t(n));
  }
  template <typename T>
  std::vector<T> vec() {
    uint64_t n = get<uint64_t>();
    if (n > (b_.size() - pos_) / sizeof(T) || !take(n * sizeof(T))) {
      ok_ = false;
      return {};
    }
    std::vector<T> v(static_cast<size_t>(n));
    std::memcpy(v.data(), b_.data() + pos_ - n * sizeof(T), size_t(n * sizeof(T)));
    return v;
  }
  // A count of items each at least min_bytes long, checked against what is left.
  uint64_t count(size_t min_bytes) {
    uint64_t n = get<uint64_t>();
    if (n > (b_.size() - pos_) / std::max<size_t>(min_bytes, 1)) ok_ = false;
    return ok_ ? n : 0;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == b_.size(); }

 private:
  bool take(uint64_t n) {
    if (!ok_ || n > b_.size() - pos_) {
      ok_ = false;
      return false;
    }
    pos_ += size_t(n);
    return true;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void put_request(Writer& w, const EngineRequest& r) {
  w.str(r.id);
  w.vec(r.prompt);
  w.put<int64_t>(r.max_tokens);
  w.put<float>(r.sampling.temperature);
  w.put<float>(r.sampling.top_p);
  w.put<int64_t>(r.sampling.top_k);
  w.put<float>(r.sampling.min_p);
  w.put<float>(r.sampling.presence_penalty);
  w.put<float>(r.sampling.frequency_penalty);
  w.put<float>(r.sampling.repetition_penalty);
  std::vector<int32_t> bias_ids;
  std::vector<float> biases;
  for (const auto& [t, b] : r.sampling.logit_bias) {
    bias_ids.push_back(t);
    biases.push_back(b);
  }
  w.vec(bias_ids);
  w.vec(biases);
  w.put<uint8_t>(r.seed.has_value());
  w.put<uint64_t>(r.seed.value_or(0));
  w.put<uint8_t>(r.ignore_eos);
  w.vec(r.stop_token_ids);
  w.put<uint8_t>(r.logprobs);
  w.put<int64_t>(r.top_logprobs);
  w.put<uint8_t>(r.hand_off);
  w.str(r.resume_from);
  w.str(r.resume_handle);
  w.vec(r.resume_generated);
  w.put<uint8_t>(r.grammar.has_value());
  if (r.grammar) {
    w.put<uint8_t>(uint8_t(r.grammar->kind));
    w.str(r.grammar->schema);
    w.put<uint8_t>(r.grammar->strict);
    w.put<uint8_t>(r.grammar->start_after.has_value());
    w.put<int32_t>(r.grammar->start_after.value_or(0));
  }
}

EngineRequest get_request(Reader& rd) {
  EngineRequest r;
  r.id = rd.str();
  r.prompt = rd.vec<int32_t>();
  r.max_tokens = rd.get<int64_t>();
  r.sampling.temperature = rd.get<float>();
  r.sampling.top_p = rd.get<float>();
  r.sampling.top_k = rd.get<int64_t>();
  r.sampling.min_p = rd.get<float>();
  r.sampling.presence_penalty = rd.get<float>();
  r.sampling.frequency_penalty = rd.get<float>();
  r.sampling.repetition_penalty = rd.get<float>();
  const std::vector<int32_t> bias_ids = rd.vec<int32_t>();
  const std::vector<float> biases = rd.vec<float>();
  for (size_t i = 0; i < std::min(bias_ids.size(), biases.size()); ++i) {
    r.sampling.logit_bias.emplace_back(bias_ids[i], biases[i]);
  }
  bool has_seed = rd.get<uint8_t>() != 0;
  uint64_t seed = rd.get<uint64_t>();
  if (has_seed) r.seed = seed;
  r.ignore_eos = rd.get<uint8_t>() != 0;
  r.stop_token_ids = rd.vec<int32_t>();
  r.logprobs = rd.get<uint8_t>() != 0;
  r.top_logprobs = rd.get<int64_t>();
  r.hand_off = rd.get<uint8_t>() != 0;
  r.resume_from = rd.str();
  r.resume_handle = rd.str();
  r.resume_generated = rd.vec<int32_t>();
  if (rd.get<uint8_t>() != 0) {
    GrammarSpec g;
    const uint8_t kind = rd.get<uint8_t>();
    g.kind = kind == uint8_t(GrammarSpec::Kind::kJsonSchema) ? GrammarSpec::Kind::kJsonSchema
                                                             : GrammarSpec::Kind::kJsonObject;
    g.schema = rd.str();
    g.strict = rd.get<uint8_t>() != 0;
    const bool has_start = rd.get<uint8_t>() != 0;
    const int32_t start = rd.get<int32_t>();
    if (has_start) g.start_after = start;
    r.grammar = std::move(g);
  }
  return r;
}

void put_output(Writer& w, const RequestOutput& o) {
  w.put<uint64_t>(o.tokens.size());
  for (const GeneratedToken& t : o.tokens) {
    w.put<int32_t>(t.id);
    w.put<float>(t.logprob);
    w.vec(t.top);
  }
  w.put<uint8_t>(o.finished);
  w.put<int32_t>(int32_t(o.finish_reason));
  w.put<int32_t>(int32_t(o.error.code()));
  w.str(o.error.message());
  w.put<int64_t>(o.prompt_tokens);
  w.put<int64_t>(o.cached_prompt_tokens);
  w.put<int64_t>(o.draft_tokens);
  w.put<int64_t>(o.accepted_draft_tokens);
  w.str(o.handoff_at);
}

RequestOutput get_output(Reader& rd) {
  RequestOutput o;
  uint64_t n = rd.count(sizeof(int32_t) + sizeof(float) + sizeof(uint64_t));
  for (uint64_t i = 0; i < n && rd.ok(); ++i) {
    GeneratedToken t;
    t.id = rd.get<int32_t>();
    t.logprob = rd.get<float>();
    t.top = rd.vec<TokenLogprob>();
    o.tokens.push_back(std::move(t));
  }
  o.finished = rd.get<uint8_t>() != 0;
  int32_t reason = rd.get<int32_t>();
  if (reason < 0 || reason > int32_t(FinishReason::kHandedOff)) {
    reason = int32_t(FinishReason::kError);
  }
  o.finish_reason = FinishReason(reason);
  int32_t code = rd.get<int32_t>();
  std::string message = rd.str();
  if (code < 0 || code > int32_t(StatusCode::kInternal)) code = int32_t(StatusCode::kInternal);
  if (code != 0) o.error = Status(StatusCode(code), std::move(message));
  o.prompt_tokens = rd.get<int64_t>();
  o.cached_prompt_tokens = rd.get<int64_t>();
  o.draft_tokens = rd.get<int64_t>();
  o.accepted_draft_tokens = rd.get<int64_t>();
  o.handoff_at = rd.str();
  return o;
}

}  // namespace

std::vector<uint8_t> encode(const FrontMessage& m) {
  Writer w;
  w.put<uint32_t>(kFrontMagic);
  w.put<uint8_t>(m.stop);
  w.put<uint64_t>(m.requests.size());
  for (const EngineRequest& r : m.requests) put_request(w, r);
  w.put<uint64_t>(m.cancels.size());
  for (const std::string& c : m.cancels) w.str(c);
  return w.take();
}

std::vector<uint8_t> encode(const RankMessage& m) {
  Writer w;
  w.put<uint32_t>(kRankMagic);
  w.put<uint64_t>(m.outputs.size());
  for (const auto& [id, out] : m.outputs) {
    w.str(id);
    put_output(w, out);
  }
  w.put(m.stats);
  return w.take();
}

Result<FrontMessage> decode_front(std::span<const uint8_t> bytes) {
  Reader rd(bytes);
  if (rd.get<uint32_t>() != kFrontMagic) return Corrupt("control message from rank 0: bad magic");
  FrontMessage m;
  m.stop = rd.get<uint8_t>() != 0;
  uint64_t n = rd.count(8);
  for (uint64_t i = 0; i < n && rd.ok(); ++i) m.requests.push_back(get_request(rd));
  n = rd.count(8);
  for (uint64_t i = 0; i < n && rd.ok(); ++i) m.cancels.push_back(rd.str());
  if (!rd.ok() || !rd.at_end()) {
    return Corrupt(fmt::format("control message from rank 0 ({} bytes) is truncated or too long",
                               bytes.size()));
  }
  return m;
}

Result<RankMessage> decode_rank(std::span<const uint8_t> bytes) {
  Reader rd(bytes);
  if (rd.get<uint32_t>() != kRankMagic) return Corrupt("control message to rank 0: bad magic");
  RankMessage m;
  uint64_t n = rd.count(8);
  for (uint64_t i = 0; i < n && rd.ok(); ++i) {
    std::string id = rd.str();
    RequestOutput o = get_output(rd);
    m.outputs.emplace_back(std::move(id), std::move(o));
  }
  m.stats = rd.get<EngineStats>();
  if (!rd.ok() || !rd.at_end()) {
    return Corrupt(
        fmt::format("control message to rank 0 ({} bytes) is truncated or too long", bytes.size()));
  }
  return m;
}

Result<std::vector<std::vector<uint8_t>>> exchange_control(
    Communicator& comm, const std::vector<std::vector<uint8_t>>& to_peer) {
  const size_t R = size_t(comm.size()), me = size_t(comm.rank());
  if (to_peer.size() != R) return Internal("exchange_control: one message per rank expected");
  std::vector<int64_t> mine(R), sizes(R * R);
  for (size_t p = 0; p < R; ++p) mine[p] = p == me ? 0 : int64_t(to_peer[p].size());
  RETURN_IF_ERROR(comm.all_gather(mine, sizes));     // sizes[q * R + p]: bytes q sends p
  constexpr int64_t kMaxMessage = int64_t(1) << 30;  // far above any step's requests/outputs
  for (size_t q = 0; q < R; ++q) {
    const int64_t n = sizes[q * R + me];
    if (n < 0 || n > kMaxMessage) {
      return Corrupt(fmt::format("control message from rank {}: {} bytes announced", q, n));
    }
  }

  std::vector<size_t> send_counts(R), send_offsets(R), recv_counts(R), recv_offsets(R);
  size_t send_total = 0, recv_total = 0;
  for (size_t p = 0; p < R; ++p) {
    send_offsets[p] = send_total;
    send_counts[p] = size_t(mine[p]);
    send_total += send_counts[p];
    recv_offsets[p] = recv_total;
    recv_counts[p] = size_t(sizes[p * R + me]);
    recv_total += recv_counts[p];
  }
  std::vector<uint8_t> send(send_total), recv(recv_total);
  for (size_t p = 0; p < R; ++p) {
    if (send_counts[p]) std::memcpy(&send[send_offsets[p]], to_peer[p].data(), send_counts[p]);
  }
  RETURN_IF_ERROR(comm.all_to_all_exact(send.data(), {send_counts, send_offsets}, recv.data(),
                                        {recv_counts, recv_offsets}));
  std::vector<std::vector<uint8_t>> from(R);
  for (size_t p = 0; p < R; ++p) {
    from[p].assign(recv.begin() + ptrdiff_t(recv_offsets[p]),
                   recv.begin() + ptrdiff_t(recv_offsets[p] + recv_counts[p]));
  }
  return from;
}

}  // namespace moeserve
