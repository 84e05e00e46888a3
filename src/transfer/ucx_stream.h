// UcxStream and UcxListener: byte streams between processes on UCX's stream API (docs/pd.md
// "Transport"). UCX picks the transport: TCP or shared memory here, RDMA where the NICs have it.
//
// Each UcxStream has its own UCX worker and is used by one thread at a time; every operation
// takes a deadline, and a peer that goes away (the endpoint's error handler) or a stop flag ends
// it at once. Waiting sleeps on the worker's event fd: an idle stream costs no CPU.
//
// A UcxListener accepts connections on its own thread and hands each one, as a UcxStream on a
// fresh worker, to a callback (that runs on the listener's thread and should pass the stream on).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_listener* ucp_listener_h;
typedef struct ucp_conn_request* ucp_conn_request_h;

namespace moeserve {

using Clock = std::chrono::steady_clock;

// One UCX context for the process (its workers are used from several threads).
class UcxContext {
 public:
  static Result<std::shared_ptr<UcxContext>> create();
  ~UcxContext();
  ucp_context_h handle() const { return ctx_; }

 private:
  ucp_context_h ctx_ = nullptr;
};

class UcxStream {
 public:
  // Connects to host:port (a UcxListener). The connection is made in the background: a peer
  // that is not there shows up as an error of the first send or recv.
  static Result<std::unique_ptr<UcxStream>> connect(std::shared_ptr<UcxContext> ctx,
                                                    const std::string& host, uint16_t port);
  ~UcxStream();  // flushes and closes (forced when the peer is gone or the flush times out)
  UcxStream(const UcxStream&) = delete;
  UcxStream& operator=(const UcxStream&) = delete;

  // Sends the parts in order (they need not stay valid after the call).
  Status send(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline);
  Status send(std::span<const uint8_t> bytes, Clock::time_point deadline) {
    const std::span<const uint8_t> parts[] = {bytes};
    return send(parts, deadline);
  }
  // Receives exactly buf.size() bytes.
  Status recv(std::span<uint8_t> buf, Clock::time_point deadline);
  // Waits end at once (with Unavailable) while *stop is true.
  void set_stop_flag(const std::atomic<bool>* stop) { stop_ = stop; }
  bool failed() const { return failed_.load(); }
  const std::string& peer() const { return peer_; }

 private:
  friend class UcxListener;
  UcxStream(std::shared_ptr<UcxContext> ctx, std::string peer)
      : ctx_(std::move(ctx)), peer_(std::move(peer)) {}
  Status init_worker();
  Status wait(void* request, Clock::time_point deadline, const char* what);
  void close_endpoint(bool force);

 public:
  void mark_failed(int status);  // (the endpoint's error handler)

 private:
  std::shared_ptr<UcxContext> ctx_;
  std::string peer_;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  int efd_ = -1;
  std::atomic<bool> failed_{false};
  std::atomic<int> fail_status_{0};
  const std::atomic<bool>* stop_ = nullptr;
};

class UcxListener {
 public:
  using OnConnection = std::function<void(std::unique_ptr<UcxStream>)>;
  // Listens on host:port (port 0: any free one; port() says which).
  static Result<std::unique_ptr<UcxListener>> listen(std::shared_ptr<UcxContext> ctx,
                                                     const std::string& host, uint16_t port,
                                                     OnConnection on_connection);
  ~UcxListener();  // stops accepting; connections already handed over are the callback's
  uint16_t port() const { return port_; }

 private:
  UcxListener(std::shared_ptr<UcxContext> ctx, OnConnection cb)
      : ctx_(std::move(ctx)), on_connection_(std::move(cb)) {}
  void loop();

 public:
  void queue(ucp_conn_request_h request);  // (the listener's connection handler)

 private:
  std::shared_ptr<UcxContext> ctx_;
  OnConnection on_connection_;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  uint16_t port_ = 0;
  std::vector<ucp_conn_request_h> pending_;  // filled by queue(), on the listener thread
  std::atomic<bool> stop_{false};
  int wake_fd_ = -1;  // eventfd: wakes loop() to stop
  std::thread thread_;
};

}  // namespace moeserve
