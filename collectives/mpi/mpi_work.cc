#include "collectives/mpi/mpi_work.h"

#include <algorithm>

#include "collectives/mpi/mpi_check.h"
#include "hsdp/log.h"

namespace hsdp::mpi {
void RequestWork::advance() {
  int flag = 0;
  int rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return finish(mpiError(rc, "MPI_Test", __FILE__, __LINE__));
  if (!flag) return;
  if (on_complete_) on_complete_();
  finish(Status());
}

}  // namespace hsdp::mpi
