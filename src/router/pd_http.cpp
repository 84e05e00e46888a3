#include "router/pd_http.h"

#include "server/api_error.h"
#include "transfer/kv_transfer.h"

namespace moeserve {

Status split_http_url(const std::string& url, std::string* host, int* port) {
  std::string rest = url.rfind("http://", 0) == 0 ? url.substr(7) : url;
  rest = rest.substr(0, rest.find('/'));
  uint16_t p = 0;
  RETURN_IF_ERROR(split_address(rest, host, &p));
  *port = p;
  return Status::Ok();
}

Reply error_reply(const Status& st) {
  const ApiError e = error_from_status(st);
  return Reply{e.http_status, "application/json", e.to_json(), nullptr};
}

}  // namespace moeserve
