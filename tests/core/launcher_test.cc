// core/launcher.h against fabricated environments: the local size's sources in their order,
// Slurm's compressed per-node lists, the step's task count, and malformed values named.
#include "core/launcher.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace hsdp::launcher {
namespace {

GetEnv envOf(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(Launcher, TasksPerNodeLists) {
  auto v = parseTasksPerNode("4(x2),3", "X");
  ASSERT_TRUE(v.ok()) << v.status().toString();
  EXPECT_EQ(*v, (std::vector<int64_t>{4, 4, 3}));
  v = parseTasksPerNode("2", "X");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (std::vector<int64_t>{2}));
  v = parseTasksPerNode("1,2(x3),5(x1)", "X");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (std::vector<int64_t>{1, 2, 2, 2, 5}));
  for (const char* bad : {"", "4(x2", "4(x)", "(x2)", "a", "4,,3", "4,", "4(x0)", "-1", "4(y2)",
                          "4(x2)3", "99999999999999999999"}) {
    auto r = parseTasksPerNode(bad, "SLURM_TASKS_PER_NODE");
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("SLURM_TASKS_PER_NODE='") + bad + "'"),
              std::string::npos)
        << r.status().toString();
  }
}

TEST(Launcher, LocalSizeOrder) {
  auto l = localSize(envOf({}));
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->has_value());
  // mpirun's wins over Slurm's (mpirun inside an sbatch allocation).
  l = localSize(envOf({{"OMPI_COMM_WORLD_LOCAL_SIZE", "5"}, {"SLURM_NTASKS_PER_NODE", "2"}}));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->value, 5);
  EXPECT_EQ((*l)->source, "OMPI_COMM_WORLD_LOCAL_SIZE");
  // The step's list, the entry of this node.
  l = localSize(envOf({{"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"},
                       {"SLURM_TASKS_PER_NODE", "8(x3)"},
                       {"SLURM_NODEID", "2"},
                       {"SLURM_NTASKS_PER_NODE", "7"}}));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->value, 3);
  EXPECT_EQ((*l)->source, "SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID=2]");
  l = localSize(envOf({{"SLURM_TASKS_PER_NODE", "4(x2),3"}, {"SLURM_NODEID", "1"}}));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->value, 4);
  // A uniform list needs no node id; a mixed one without it falls through to the next source.
  l = localSize(envOf({{"SLURM_TASKS_PER_NODE", "6(x4)"}}));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->value, 6);
  l = localSize(envOf({{"SLURM_TASKS_PER_NODE", "4(x2),3"}, {"SLURM_NTASKS_PER_NODE", "4"}}));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->value, 4);
  EXPECT_EQ((*l)->source, "SLURM_NTASKS_PER_NODE");
  l = localSize(envOf({{"SLURM_TASKS_PER_NODE", "4(x2),3"}}));
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->has_value());
  // PMIx alone: no variable carries the local size.
  l = localSize(envOf({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "x"}}));
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->has_value());
}

TEST(Launcher, LocalSizeMalformedNamesTheVariable) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string want;
  };
  for (const Case& c : std::vector<Case>{
           {{{"OMPI_COMM_WORLD_LOCAL_SIZE", "x"}}, "OMPI_COMM_WORLD_LOCAL_SIZE='x'"},
           {{{"SLURM_NTASKS_PER_NODE", "0"}}, "SLURM_NTASKS_PER_NODE"},
           {{{"SLURM_TASKS_PER_NODE", "4(x2"}}, "SLURM_TASKS_PER_NODE='4(x2'"},
           {{{"SLURM_STEP_TASKS_PER_NODE", "3,4"}, {"SLURM_NODEID", "abc"}}, "SLURM_NODEID='abc'"},
           {{{"SLURM_TASKS_PER_NODE", "4(x2),3"}, {"SLURM_NODEID", "3"}},
            "SLURM_NODEID=3 is outside SLURM_TASKS_PER_NODE='4(x2),3' (3 nodes)"},
       }) {
    auto l = localSize(envOf(c.env));
    ASSERT_FALSE(l.ok()) << c.want;
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().toString().find(c.want), std::string::npos) << l.status().toString();
  }
}

TEST(Launcher, SlurmTasksPrefersTheStep) {
  auto t = slurmTasks(envOf({}));
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
  t = slurmTasks(envOf({{"SLURM_NTASKS", "6"}}));
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->value, 6);
  EXPECT_EQ((*t)->source, "SLURM_NTASKS");
  // srun -n1 inside an allocation of 6: the step has 1 task.
  t = slurmTasks(envOf({{"SLURM_NTASKS", "6"}, {"SLURM_STEP_NUM_TASKS", "1"}}));
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->value, 1);
  EXPECT_EQ((*t)->source, "SLURM_STEP_NUM_TASKS");
  t = slurmTasks(envOf({{"SLURM_NTASKS", "six"}}));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().toString().find("SLURM_NTASKS='six'"), std::string::npos)
      << t.status().toString();
}

TEST(Launcher, SrunStepWithoutPmi) {
  const std::map<std::string, std::string> step = {
      {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "6"}, {"SLURM_NTASKS", "6"}};
  // srun --mpi=none: the trap, with the step's count.
  auto t = srunStepWithoutPmi(envOf(step));
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->value, 6);
  EXPECT_EQ((*t)->source, "SLURM_STEP_NUM_TASKS");
  // Any process-management interface (srun --mpi=pmix, PMI-2, mpirun's daemons): fine.
  for (const char* pmi : {"PMIX_RANK", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_SIZE"}) {
    auto with = step;
    with[pmi] = "0";
    t = srunStepWithoutPmi(envOf(with));
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t->has_value()) << pmi;
  }
  // A batch script (no step id), a step of one task, no Slurm: nothing to say.
  for (auto env :
       {std::map<std::string, std::string>{{"SLURM_NTASKS", "6"}},
        std::map<std::string, std::string>{{"SLURM_STEP_ID", "3"}, {"SLURM_STEP_NUM_TASKS", "1"}},
        std::map<std::string, std::string>{}}) {
    t = srunStepWithoutPmi(envOf(env));
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t->has_value());
  }
  auto bad = step;
  bad["SLURM_STEP_NUM_TASKS"] = "x";
  t = srunStepWithoutPmi(envOf(bad));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().toString().find("SLURM_STEP_NUM_TASKS='x'"), std::string::npos)
      << t.status().toString();
}

}  // namespace
}  // namespace hsdp::launcher
