// make_mpi_communicator for builds without MPI (CMake did not find it).
#include "ep/communicator.h"

namespace moeserve {

bool mpi_available() {
  return false;
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator(CommOptions) {
  return Unimplemented(
      "this moeserve was built without MPI: install libopenmpi-dev (scripts/install-deps.sh) "
      "and rebuild to run expert parallelism across processes");
}

}  // namespace moeserve
