// What the launcher says about the job before MPI_Init, from its environment, for decisions that
// must be made before MPI runs (Open MPI's settings in MPI_Init) or that check MPI against the
// launcher (a world of one under Slurm). After MPI_Init the truth is MPI's: ranks, world size,
// and the ranks on this host (Comm::splitByHost, MPI_COMM_TYPE_SHARED).
//
// Local size (ranks on this host), first source present wins:
//  1. OMPI_COMM_WORLD_LOCAL_SIZE (mpirun/prterun, also inside an sbatch allocation);
//  2. SLURM_STEP_TASKS_PER_NODE with SLURM_NODEID (srun: the step's own layout);
//  3. SLURM_TASKS_PER_NODE with SLURM_NODEID;
//  4. SLURM_NTASKS_PER_NODE (what --ntasks-per-node asked for);
//  else unknown. The per-node lists are Slurm's compressed form: "4(x2),3" is 4,4,3. A list with
// one value per node needs no SLURM_NODEID; with several values and no SLURM_NODEID the source
// says nothing and the next one is asked. PMIx publishes the local size only as a key for
// PMIx_Get (PMIX_LOCAL_SIZE, "pmix.local.size"), not as an environment variable, so a direct
// PMIx launch without Slurm's variables is unknown here.
//
// A variable that is set but malformed (not a count, a list that does not parse, a node id
// outside the list) is an InvalidArgument naming the variable and its value: the launcher wrote
// it, so a bad one means the environment is not what hsdp would be judging by.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::launcher {

// Reads one environment variable; nullptr when unset. Tests pass fabricated environments.
using GetEnv = std::function<const char*(const char*)>;
const char* processEnv(const char* name);

struct Count {
  int64_t value = 0;
  std::string source;  // the variable(s) it came from, e.g. "SLURM_TASKS_PER_NODE[1]"
};

// Slurm's per-node task list ("4(x2),3") expanded; InvalidArgument naming `name` and the text.
StatusOr<std::vector<int64_t>> parseTasksPerNode(std::string_view text, std::string_view name);

// Ranks on this host before MPI_Init, by the order above; nullopt when unknown.
StatusOr<std::optional<Count>> localSize(const GetEnv& get = processEnv);

// The number of tasks Slurm started for this step: SLURM_STEP_NUM_TASKS (set by srun for its
// step), else SLURM_NTASKS (the job's, also set for a batch script), else nullopt (not under
// Slurm). Malformed: InvalidArgument naming the variable and value.
StatusOr<std::optional<Count>> slurmTasks(const GetEnv& get = processEnv);

// srun started this task as one of N > 1 (SLURM_STEP_ID set, SLURM_STEP_NUM_TASKS = N) without
// a process-management interface: none of PMIX_RANK (--mpi=pmix), PMI_RANK or PMI_FD (PMI-1/2)
// or OMPI_COMM_WORLD_SIZE (mpirun) is set. MPI would come up as N worlds of one (or, Open MPI 4,
// abort inside MPI_Init with its own message); the step's count is returned so that the caller
// can say so before MPI_Init. nullopt otherwise (no srun step, one task, a PMI present).
StatusOr<std::optional<Count>> srunStepWithoutPmi(const GetEnv& get = processEnv);

}  // namespace hsdp::launcher
