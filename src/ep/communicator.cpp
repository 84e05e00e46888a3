#include "ep/communicator.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace moeserve {

Status Communicator::all_to_all_exact(const void* send, PeerChunks send_chunks, void* recv,
                                      PeerChunks recv_chunks) {
  std::vector<size_t> received(size_t(size()), 0);
  RETURN_IF_ERROR(all_to_all_v(send, send_chunks, recv, recv_chunks, received));
  for (int p = 0; p < size(); ++p) {
    if (received[size_t(p)] != recv_chunks.counts[size_t(p)]) {
      return Corrupt(fmt::format("rank {} sent {} bytes to rank {}, expected {}", p,
                                 received[size_t(p)], rank(), recv_chunks.counts[size_t(p)]));
    }
  }
  return Status::Ok();
}

Status Communicator::all_gather(std::span<const int64_t> mine, std::span<int64_t> all) {
  const size_t n = size_t(size()), bytes = mine.size() * sizeof(int64_t);
  if (all.size() != n * mine.size()) return Internal("all_gather: output size != size() * n");
  std::vector<size_t> send_counts(n, bytes), send_offsets(n, 0), recv_offsets(n);
  for (size_t p = 0; p < n; ++p) recv_offsets[p] = p * bytes;
  return all_to_all_exact(mine.data(), {send_counts, send_offsets}, all.data(),
                          {send_counts, recv_offsets});
}

Status Communicator::barrier() {
  const size_t n = size_t(size());
  std::vector<size_t> zeros(n, 0);
  uint8_t none = 0;
  return all_to_all_exact(&none, {zeros, zeros}, &none, {zeros, zeros});
}

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

}  // namespace moeserve
