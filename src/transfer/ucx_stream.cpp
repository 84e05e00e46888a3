#include "transfer/ucx_stream.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <ucp/api/ucp.h>

namespace moeserve {

namespace {

constexpr auto kPollSlice = std::chrono::milliseconds(50);  // how soon a stop flag is seen
constexpr auto kCloseWait = std::chrono::seconds(1);        // flushing at close

std::string ucs_error(ucs_status_t st) {
  return ucs_status_string(st);
}

void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<UcxStream*>(arg)->mark_failed(int(status));
}

void on_conn(ucp_conn_request_h request, void* arg) {
  static_cast<UcxListener*>(arg)->queue(request);
}

// host (a name or a numeric address) and port as a sockaddr.
Status resolve(const std::string& host, uint16_t port, sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) {
    return InvalidArgument(fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc)));
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = socklen_t(res->ai_addrlen);
  freeaddrinfo(res);
  return Status::Ok();
}

std::string address_string(const sockaddr_storage& sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    port = ntohs(in->sin_port);
  } else if (sa.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf));
    port = ntohs(in->sin6_port);
  }
  return fmt::format("{}:{}", buf, port);
}

Result<ucp_worker_h> make_worker(ucp_context_h ctx, int* efd) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w = nullptr;
  ucs_status_t st = ucp_worker_create(ctx, &wp, &w);
  if (st != UCS_OK) return Unavailable("UCX: cannot create a worker: " + ucs_error(st));
  st = ucp_worker_get_efd(w, efd);
  if (st != UCS_OK) {
    ucp_worker_destroy(w);
    return Unavailable("UCX: the worker has no event fd: " + ucs_error(st));
  }
  return w;
}

}  // namespace

Result<std::shared_ptr<UcxContext>> UcxContext::create() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Unavailable("UCX: cannot read its configuration: " + ucs_error(st));
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 1;
  auto ctx = std::shared_ptr<UcxContext>(new UcxContext());
  st = ucp_init(&p, config, &ctx->ctx_);
  ucp_config_release(config);
  if (st != UCS_OK) return Unavailable("UCX: cannot initialise: " + ucs_error(st));
  return ctx;
}

UcxContext::~UcxContext() {
  if (ctx_) ucp_cleanup(ctx_);
}

// ---- UcxStream ----

Status UcxStream::init_worker() {
  auto w = make_worker(ctx_->handle(), &efd_);
  if (!w.ok()) return w.status();
  worker_ = *w;
  return Status::Ok();
}

Result<std::unique_ptr<UcxStream>> UcxStream::connect(std::shared_ptr<UcxContext> ctx,
                                                      const std::string& host, uint16_t port) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  RETURN_IF_ERROR(resolve(host, port, &sa, &len));
  std::unique_ptr<UcxStream> s(new UcxStream(std::move(ctx), fmt::format("{}:{}", host, port)));
  RETURN_IF_ERROR(s->init_worker());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = len;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = s.get();
  const ucs_status_t st = ucp_ep_create(s->worker_, &ep, &s->ep_);
  if (st != UCS_OK) {
    return Unavailable(fmt::format("UCX: cannot connect to {}: {}", s->peer_, ucs_error(st)));
  }
  return s;
}

void UcxStream::mark_failed(int status) {
  fail_status_.store(status);
  failed_.store(true);
}

void UcxStream::close_endpoint(bool force) {
  if (!ep_) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* r = ucp_ep_close_nbx(ep_, &p);
  ep_ = nullptr;
  if (r && !UCS_PTR_IS_ERR(r)) {
    const auto until = Clock::now() + kCloseWait;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(r);
  }
}

UcxStream::~UcxStream() {
  if (ep_) close_endpoint(/*force=*/failed_.load());
  if (worker_) {
    while (ucp_worker_progress(worker_) > 0) {
    }
    ucp_worker_destroy(worker_);
  }
}

Status UcxStream::wait(void* r, Clock::time_point deadline, const char* what) {
  if (r == nullptr) return Status::Ok();
  if (UCS_PTR_IS_ERR(r)) {
    failed_.store(true);
    return Unavailable(fmt::format("{} {}: {}", what, peer_, ucs_error(UCS_PTR_STATUS(r))));
  }
  std::string why;
  while (true) {
    const ucs_status_t st = ucp_request_check_status(r);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(r);
      if (st == UCS_OK) return Status::Ok();
      failed_.store(true);
      return Unavailable(fmt::format(
          "{} {}: {}", what, peer_,
          failed_ && fail_status_ ? ucs_error(ucs_status_t(fail_status_.load())) : ucs_error(st)));
    }
    const auto now = Clock::now();
    if (failed_.load()) {
      why = "the connection is lost (" + ucs_error(ucs_status_t(fail_status_.load())) + ")";
    } else if (stop_ && stop_->load()) {
      why = "stopping";
    } else if (now >= deadline) {
      why = "timed out";
    }
    if (!why.empty()) break;
    if (ucp_worker_progress(worker_) > 0) continue;
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;
    const auto slice = std::min<Clock::duration>(deadline - now, kPollSlice);
    pollfd pfd{efd_, POLLIN, 0};
    poll(&pfd, 1, int(std::chrono::ceil<std::chrono::milliseconds>(slice).count()));
  }
  // Give up on the operation; the stream is unusable from now on. The request must not outlive
  // the call (it may point into the caller's buffer): cancel it, and if it does not end, close
  // the endpoint by force, which ends it.
  failed_.store(true);
  ucp_request_cancel(worker_, r);
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) {
    ucp_worker_progress(worker_);
  }
  if (ucp_request_check_status(r) == UCS_INPROGRESS) {
    close_endpoint(/*force=*/true);
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
  }
  ucp_request_free(r);
  return Unavailable(fmt::format("{} {}: {}", what, peer_, why));
}

Status UcxStream::send(std::span<const std::span<const uint8_t>> parts,
                       Clock::time_point deadline) {
  if (failed_.load() || !ep_) {
    return Unavailable(fmt::format("sending to {}: the connection is lost", peer_));
  }
  // All parts in one operation (an I/O vector): a frame's header and body leave together.
  std::vector<ucp_dt_iov_t> iov;
  for (std::span<const uint8_t> part : parts) {
    if (!part.empty()) iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
  }
  if (iov.empty()) return Status::Ok();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_iov();
  void* r = ucp_stream_send_nbx(ep_, iov.data(), iov.size(), &p);
  return wait(r, deadline, "sending to");
}

Status UcxStream::recv(std::span<uint8_t> buf, Clock::time_point deadline) {
  if (buf.empty()) return Status::Ok();
  if (failed_.load() || !ep_)
    return Unavailable(fmt::format("receiving from {}: the connection is lost", peer_));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  size_t length = 0;
  void* r = ucp_stream_recv_nbx(ep_, buf.data(), buf.size(), &length, &p);
  return wait(r, deadline, "receiving from");
}

// ---- UcxListener ----

Result<std::unique_ptr<UcxListener>> UcxListener::listen(std::shared_ptr<UcxContext> ctx,
                                                         const std::string& host, uint16_t port,
                                                         OnConnection on_connection) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  RETURN_IF_ERROR(resolve(host, port, &sa, &len));
  std::unique_ptr<UcxListener> l(new UcxListener(std::move(ctx), std::move(on_connection)));
  auto w = make_worker(l->ctx_->handle(), &l->efd_);
  if (!w.ok()) return w.status();
  l->worker_ = *w;
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  lp.sockaddr.addrlen = len;
  lp.conn_handler.cb = on_conn;
  lp.conn_handler.arg = l.get();
  ucs_status_t st = ucp_listener_create(l->worker_, &lp, &l->listener_);
  if (st != UCS_OK) {
    return Unavailable(fmt::format("UCX: cannot listen on {}:{}: {}", host, port, ucs_error(st)));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(l->listener_, &attr);
  if (st != UCS_OK) return Unavailable("UCX: cannot query the listener: " + ucs_error(st));
  l->port_ = attr.sockaddr.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port)
                 : ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  l->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (l->wake_fd_ < 0) return Unavailable("eventfd failed");
  l->thread_ = std::thread([p = l.get()] { p->loop(); });
  return l;
}

void UcxListener::queue(ucp_conn_request_h request) {
  pending_.push_back(request);
}

void UcxListener::loop() {
  while (!stop_.load()) {
    while (ucp_worker_progress(worker_) > 0) {
    }
    std::vector<ucp_conn_request_h> requests;
    requests.swap(pending_);
    for (ucp_conn_request_h req : requests) {
      ucp_conn_request_attr_t attr{};
      attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      std::string peer = ucp_conn_request_query(req, &attr) == UCS_OK
                             ? address_string(attr.client_address)
                             : std::string("?");
      std::unique_ptr<UcxStream> s(new UcxStream(ctx_, std::move(peer)));
      if (!s->init_worker().ok()) {
        ucp_listener_reject(listener_, req);
        continue;
      }
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.conn_request = req;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = on_ep_error;
      ep.err_handler.arg = s.get();
      if (ucp_ep_create(s->worker_, &ep, &s->ep_) != UCS_OK) continue;
      on_connection_(std::move(s));
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    pollfd pfd[2] = {{efd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(pfd, 2, int(kPollSlice.count()));
  }
}

UcxListener::~UcxListener() {
  stop_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  for (ucp_conn_request_h req : pending_) ucp_listener_reject(listener_, req);
  if (listener_) ucp_listener_destroy(listener_);
  if (worker_) ucp_worker_destroy(worker_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

}  // namespace moeserve
