// HSDP_BIND next to a launcher's binding (srun --cpu-bind, mpirun --bind-to core, taskset): the
// pure refinement of a plan on recorded machines, and live, in this process, with the affinity
// narrowed by sched_setaffinity and checked with sched_getaffinity (the kernel's own answer, not
// hwloc's).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "topology/cluster_topology.h"
#include "topology/node_topology.h"

namespace hsdp {
namespace {

const std::string kDir = HSDP_TOPO_FIXTURES;

NodeTopology load(const std::string& xml) {
  TopologySources s;
  s.hwloc_xml = kDir + "/" + xml;
  auto t = discoverNodeTopology(s);
  EXPECT_TRUE(t.ok()) << t.status().toString();
  return t.ok() ? *t : NodeTopology();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LauncherCpus, StrictSubsetOfTheAllowedCpusIsALauncherBinding) {
  EXPECT_EQ((CpuBinding{"0-3,8", "0-15"}.launcherCpus()), "0-3,8");
  EXPECT_EQ((CpuBinding{"5", "0-7"}.launcherCpus()), "5");
  EXPECT_EQ((CpuBinding{"0-15", "0-15"}.launcherCpus()), "");  // free to run anywhere allowed
  EXPECT_EQ((CpuBinding{"0-7", "0-3"}.launcherCpus()), "");    // wider than allowed: not narrowed
  EXPECT_EQ((CpuBinding{"", "0-15"}.launcherCpus()), "");      // unreadable: not a binding
}

TEST(RespectLauncher, UnboundPlansAreUnchanged) {
  NodeTopology t = load("dgx_h100.xml");
  for (BindMode m : {BindMode::kAuto, BindMode::kNone, BindMode::kNuma, BindMode::kCore})
    for (int r = 0; r < 8; ++r) {
      BindPlan p = planBinding(t, r, 8, m);
      BindPlan q = respectLauncherBinding(p, "");
      EXPECT_EQ(q.mode, p.mode);
      EXPECT_EQ(q.cpuset, p.cpuset);
      EXPECT_EQ(q.reason, p.reason);
      EXPECT_EQ(q.describe(), p.describe());
      EXPECT_EQ(q.launcher_cpus, "");
    }
}

TEST(RespectLauncher, AutoKeepsTheLaunchersBinding) {
  NodeTopology t = load("dgx_h100.xml");
  BindPlan p = planBinding(t, 5, 8, BindMode::kAuto);
  ASSERT_EQ(p.mode, BindMode::kNuma);  // unbound, hsdp would bind rank 5 to NUMA 1
  BindPlan q = respectLauncherBinding(p, "0-1");
  EXPECT_EQ(q.mode, BindMode::kNone);
  EXPECT_EQ(q.cpuset, "");
  EXPECT_EQ(q.launcher_cpus, "0-1");
  EXPECT_EQ(q.reason, "bound by the launcher to cpus 0-1; kept");
  EXPECT_EQ(q.gpu, 5);
  EXPECT_TRUE(contains(q.describe(), "launcher-bound (HSDP_BIND=auto)")) << q.describe();
  // Also where auto would not have bound anyway (one NUMA node): the launcher's cpus are named.
  NodeTopology w = load("workstation_4gpu.xml");
  BindPlan wq = respectLauncherBinding(planBinding(w, 0, 4, BindMode::kAuto), "2,3");
  EXPECT_EQ(wq.mode, BindMode::kNone);
  EXPECT_EQ(wq.reason, "bound by the launcher to cpus 2-3; kept");
}

TEST(RespectLauncher, NumaAndCoreBindToTheIntersection) {
  NodeTopology t = load("dgx_h100.xml");  // NUMA 0 = cpus 0-111, NUMA 1 = 112-223
  // Launcher gave 100-119 (straddling the sockets): rank 0 (NUMA 0) gets 100-111, rank 4 112-119.
  BindPlan a = respectLauncherBinding(planBinding(t, 0, 8, BindMode::kNuma), "100-119");
  EXPECT_EQ(a.mode, BindMode::kNuma);
  EXPECT_EQ(a.numa, 0);
  EXPECT_EQ(a.cpuset, "100-111");
  EXPECT_EQ(a.launcher_cpus, "100-119");
  EXPECT_TRUE(contains(a.reason, "narrowed from 0-111 to the launcher's cpus 100-119")) << a.reason;
  BindPlan b = respectLauncherBinding(planBinding(t, 4, 8, BindMode::kNuma), "100-119");
  EXPECT_EQ(b.mode, BindMode::kNuma);
  EXPECT_EQ(b.cpuset, "112-119");
  // A launcher binding wider than hsdp's choice: hsdp's choice is already inside it.
  BindPlan c = respectLauncherBinding(planBinding(t, 1, 8, BindMode::kCore), "0-7");
  EXPECT_EQ(c.mode, BindMode::kCore);
  EXPECT_EQ(c.cpuset, "2-3");
  EXPECT_TRUE(contains(c.reason, "inside the launcher's cpus 0-7")) << c.reason;
  // On the CPU-only host, rank 2 sits next to mlx5_1 (NUMA 2); the launcher gave a mixed list.
  NodeTopology cpu = load("cpu_2socket.xml");
  BindPlan p = planBinding(cpu, 2, 4, BindMode::kNuma);
  const std::string numa2 = cpu.numa_nodes[cpu.numaSlot(2)].cpuset;
  ASSERT_EQ(p.cpuset, numa2);
  BindPlan q = respectLauncherBinding(p, "0," + numa2);
  EXPECT_EQ(q.mode, BindMode::kNuma);
  EXPECT_EQ(q.cpuset, numa2);
}

TEST(RespectLauncher, DisjointCpusKeepTheLaunchersBinding) {
  NodeTopology t = load("dgx_h100.xml");
  BindPlan p = respectLauncherBinding(planBinding(t, 6, 8, BindMode::kNuma), "0-3");
  EXPECT_EQ(p.mode, BindMode::kNone);
  EXPECT_EQ(p.cpuset, "");
  EXPECT_EQ(p.launcher_cpus, "0-3");
  EXPECT_TRUE(contains(p.reason, "112-223")) << p.reason;  // hsdp's choice
  EXPECT_TRUE(contains(p.reason, "0-3")) << p.reason;      // the launcher's
  EXPECT_TRUE(contains(p.reason, "kept the launcher's binding")) << p.reason;
  BindPlan c = respectLauncherBinding(planBinding(t, 1, 8, BindMode::kCore), "8");
  EXPECT_EQ(c.mode, BindMode::kNone);
  EXPECT_TRUE(contains(c.reason, "cpus 2-3")) << c.reason;
  EXPECT_TRUE(contains(c.reason, "launcher's cpus 8")) << c.reason;
}

TEST(RespectLauncher, NoneIsUnchangedAndUnknownLocalityNamesTheLauncher) {
  NodeTopology t = load("dgx_h100.xml");
  BindPlan p = planBinding(t, 3, 8, BindMode::kNone);
  BindPlan q = respectLauncherBinding(p, "0-1");
  EXPECT_EQ(q.describe(), p.describe());
  EXPECT_EQ(q.launcher_cpus, "");
  // numa with no locality: nothing to bind, and the launcher's binding stays.
  NodeTopology blank;
  BindPlan u = respectLauncherBinding(planBinding(blank, 0, 1, BindMode::kNuma), "4");
  EXPECT_EQ(u.mode, BindMode::kNone);
  EXPECT_TRUE(contains(u.reason, "bound by the launcher to cpus 4; kept")) << u.reason;
}

TEST(RespectLauncher, PlanSurvivesTheRankViewWire) {
  NodeTopology t = load("dgx_h100.xml");
  RankView v;
  v.bind = respectLauncherBinding(planBinding(t, 0, 8, BindMode::kNuma), "100-119");
  auto back = parseRankView(serializeRankView(v));
  ASSERT_TRUE(back.ok()) << back.status().toString();
  EXPECT_EQ(back->bind.launcher_cpus, "100-119");
  EXPECT_EQ(back->bind.describe(), v.bind.describe());
}

// The kernel's view of this thread's affinity.
std::vector<int> affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

bool setAffinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

int threadsOfThisProcess() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Puts back the affinity and memory policy this thread started with, on every exit path. The
// test process has one thread, so that is the process's (hwloc's HWLOC_CPUBIND_PROCESS binding
// went to every thread, i.e. this one).
class BindingRestorer {
 public:
  BindingRestorer() : start_(affinity()) {}
  ~BindingRestorer() {
    if (!start_.empty()) setAffinity(start_);
    syscall(SYS_set_mempolicy, 0 /* MPOL_DEFAULT */, nullptr, 0);
  }
  const std::vector<int>& start() const { return start_; }

 private:
  std::vector<int> start_;
};

TEST(LiveLauncherBinding, NarrowedAffinityIsReadAndNeverWidened) {
  ASSERT_EQ(threadsOfThisProcess(), 1);  // else sched_setaffinity(0) narrows one thread only
  auto unbound = readCpuBinding();
  ASSERT_TRUE(unbound.ok()) << unbound.status().toString();
  BindingRestorer restore;
  const std::vector<int>& start = restore.start();
  ASSERT_FALSE(start.empty());
  if (start.size() < 2) GTEST_SKIP() << "only one CPU allowed: cannot narrow the affinity";
  // Unnarrowed, the process is not bound by a launcher (unless the test itself runs under one).
  if (unbound->launcherCpus().empty()) EXPECT_EQ(unbound->bound, unbound->allowed);

  const int cpu = start.back();
  const std::string cpu_list = std::to_string(cpu);
  ASSERT_TRUE(setAffinity({cpu}));
  ASSERT_EQ(affinity(), std::vector<int>{cpu});

  auto bound = readCpuBinding();
  ASSERT_TRUE(bound.ok()) << bound.status().toString();
  EXPECT_EQ(bound->bound, cpu_list);
  EXPECT_EQ(bound->launcherCpus(), cpu_list);

  auto topo = nodeTopologyFromLiveMachine();
  ASSERT_TRUE(topo.ok()) << topo.status().toString();
  for (BindMode mode : {BindMode::kNuma, BindMode::kCore, BindMode::kAuto}) {
    BindPlan plan = respectLauncherBinding(planBinding(*topo, 0, 1, mode), bound->launcherCpus());
    SCOPED_TRACE(plan.describe());
    EXPECT_EQ(plan.launcher_cpus, cpu_list);
    if (plan.mode != BindMode::kNone) EXPECT_EQ(plan.cpuset, cpu_list);
    // A kernel without NUMA memory policy (ENOSYS) refuses the membind after the CPU binding.
    Status s = applyBinding(*topo, plan);
    EXPECT_TRUE(s.ok() || contains(s.message(), "CPUs bound to " + cpu_list + ", but"))
        << s.toString();
    EXPECT_EQ(affinity(), std::vector<int>{cpu});  // still only the launcher's CPU
  }
  // hsdp's own binding (if numa or core bound above) still reads as the launcher's.
  auto again = readCpuBinding();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->launcherCpus(), cpu_list);

  ASSERT_TRUE(setAffinity(start));
  EXPECT_EQ(affinity(), start);
  auto after = readCpuBinding();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->bound, unbound->bound);
}

}  // namespace
}  // namespace hsdp
