// The in-process communicator: ranks are threads of one process and messages are byte vectors
// in a shared mailbox (one FIFO per destination, source and channel).
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "ep/communicator.h"

namespace moeserve {

namespace {

enum class Channel { kCollective, kPointToPoint };

class Hub {
 public:
  Hub(int size, CommOptions options) : size_(size), options_(options) {}

  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  void post(int dst, int src, Channel ch, int tag, std::vector<uint8_t> msg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      box_[Key{dst, src, ch, tag}].push_back(std::move(msg));
    }
    cv_.notify_all();
  }

  // Waits until every source in `srcs` has a message for dst on (ch, tag) or the deadline
  // passes; pops the available ones into out[src]. Returns the sources still missing.
  std::vector<int> take(int dst, const std::vector<int>& srcs, Channel ch, int tag,
                        std::chrono::steady_clock::time_point deadline,
                        std::vector<std::vector<uint8_t>>& out) {
    std::unique_lock<std::mutex> lock(mu_);
    auto all_there = [&] {
      for (int s : srcs) {
        auto it = box_.find(Key{dst, s, ch, tag});
        if (it == box_.end() || it->second.empty()) return false;
      }
      return true;
    };
    cv_.wait_until(lock, deadline, all_there);
    std::vector<int> missing;
    for (int s : srcs) {
      auto it = box_.find(Key{dst, s, ch, tag});
      if (it == box_.end() || it->second.empty()) {
        missing.push_back(s);
        continue;
      }
      out[size_t(s)] = std::move(it->second.front());
      it->second.pop_front();
    }
    // A partial take leaves the group failed anyway; nothing is put back.
    return missing;
  }

 private:
  using Key = std::tuple<int, int, Channel, int>;  // dst, src, channel, tag

  const int size_;
  const CommOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::deque<std::vector<uint8_t>>> box_;  // guarded by mu_
};

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  const char* transport() const override { return "in-process"; }

  Status all_to_all_v(const void* send, PeerChunks send_chunks, void* recv,
                      PeerChunks recv_capacity, std::span<size_t> received) override {
    if (!failed_.ok()) return failed_;
    const int n = size();
    const auto* s = static_cast<const uint8_t*>(send);
    for (int p = 0; p < n; ++p) {
      const uint8_t* begin = s + send_chunks.offsets[size_t(p)];
      hub_->post(p, rank_, Channel::kCollective, 0,
                 std::vector<uint8_t>(begin, begin + send_chunks.counts[size_t(p)]));
    }
    std::vector<int> srcs(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) srcs[size_t(p)] = p;
    std::vector<std::vector<uint8_t>> msgs(static_cast<size_t>(n));
    std::vector<int> missing = hub_->take(rank_, srcs, Channel::kCollective, 0, deadline(), msgs);
    if (!missing.empty()) {
      return fail(
          Unavailable(fmt::format("all-to-all on rank {}: no data from {} within {} ms "
                                  "(dead or hung?)",
                                  rank_, rank_list(missing), timeout_ms())));
    }
    auto* r = static_cast<uint8_t*>(recv);
    for (int p = 0; p < n; ++p) {
      const std::vector<uint8_t>& m = msgs[size_t(p)];
      if (m.size() > recv_capacity.counts[size_t(p)]) {
        return fail(
            Corrupt(fmt::format("all-to-all: rank {} sent {} bytes to rank {}, over the "
                                "capacity of {}",
                                p, m.size(), rank_, recv_capacity.counts[size_t(p)])));
      }
      if (!m.empty()) std::memcpy(r + recv_capacity.offsets[size_t(p)], m.data(), m.size());
      received[size_t(p)] = m.size();
    }
    return Status::Ok();
  }

  Status send(int peer, int tag, std::span<const uint8_t> bytes) override {
    if (!failed_.ok()) return failed_;
    if (peer < 0 || peer >= size()) return InvalidArgument(fmt::format("send: no rank {}", peer));
    hub_->post(peer, rank_, Channel::kPointToPoint, tag,
               std::vector<uint8_t>(bytes.begin(), bytes.end()));
    return Status::Ok();
  }

  Result<size_t> recv(int peer, int tag, std::span<uint8_t> buffer) override {
    if (!failed_.ok()) return failed_;
    if (peer < 0 || peer >= size()) return InvalidArgument(fmt::format("recv: no rank {}", peer));
    std::vector<std::vector<uint8_t>> msgs(static_cast<size_t>(size()));
    if (!hub_->take(rank_, {peer}, Channel::kPointToPoint, tag, deadline(), msgs).empty()) {
      return fail(
          Unavailable(fmt::format("recv on rank {}: no message from rank {} within {} ms "
                                  "(dead or hung?)",
                                  rank_, peer, timeout_ms())));
    }
    const std::vector<uint8_t>& m = msgs[size_t(peer)];
    if (m.size() > buffer.size()) {
      return fail(Corrupt(fmt::format("recv: rank {} sent {} bytes, buffer holds {}", peer,
                                      m.size(), buffer.size())));
    }
    std::memcpy(buffer.data(), m.data(), m.size());
    return m.size();
  }

 private:
  std::chrono::steady_clock::time_point deadline() const {
    return std::chrono::steady_clock::now() + hub_->options().timeout;
  }
  int64_t timeout_ms() const { return int64_t(hub_->options().timeout.count()); }
  Status fail(Status s) {
    failed_ = s;
    return s;
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  Status failed_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size, CommOptions options) {
  auto hub = std::make_shared<Hub>(size, options);
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < size; ++r) group.push_back(std::make_unique<InProcessCommunicator>(hub, r));
  return group;
}

}  // namespace moeserve
