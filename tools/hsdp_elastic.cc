// hsdp-elastic: starts and watches the replica groups of one elastic job (issue 31;
// docs/elastic_launcher.md). Each group is its own MPI job, so the loss of one of its ranks ends
// only that group; the launcher restarts it while the others keep training.
//
//   hsdp-elastic --groups 3 --np 2 -- build/examples/train_gpt --preset tiny ...
//   hsdp-elastic --groups 2 --np 8 --group-hosts "n0,n1;n2,n3" --spare-hosts "n4,n5" \
//                --launcher-args "--bind-to none" -- train_gpt ...
//
// Without --endpoint it starts an etcd for the job on this machine (elastic/local_etcd.h) and
// stops it on every way out. Exit codes: 0 every group ended with 0; the exit code of the first
// group that gave up (after --max-restarts restarts); 2 bad input (nothing started); 3 the local
// etcd could not be started or exited, or a group could not be started; 128+signal when stopped
// by SIGINT, SIGTERM or SIGHUP.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "elastic/etcd_client.h"
#include "elastic/local_etcd.h"
#include "elastic/quorum.h"
#include "elastic_launch.h"
#include "hsdp/cli.h"

namespace {

using hsdp::StatusOr;
using hsdp::elastic_launch::LauncherKind;
using hsdp::elastic_launch::Plan;

struct Flags {
  int groups = 0, np = 0, max_restarts = 3;
  double grace_s = 10;
  std::string endpoint, job, launcher = "mpirun", launcher_args, group_hosts, spare_hosts;
};

bool validHost(const std::string& s) {  // a host name or address, with mpirun's ":slots"
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-' &&
        c != ':')
      return false;
  return !s.empty();
}

// "h0,h1;h2,h3": host sets separated by ';', the hosts of a set by ','.
StatusOr<std::vector<std::vector<std::string>>> parseHostSets(const std::string& text,
                                                              const std::string& flag) {
  std::vector<std::vector<std::string>> sets;
  std::stringstream ss(text + ";");  // a trailing ';' of the user's makes an empty last set
  std::string set;
  while (std::getline(ss, set, ';')) {
    const int k = static_cast<int>(sets.size()) + 1;
    if (set.find_first_not_of(" \t") == std::string::npos)
      return hsdp::invalidArgument(flag, " '", text, "': host set ", k, " is empty");
    HSDP_ASSIGN_OR_RETURN(std::vector<std::string> hosts,
                          hsdp::parseList(set, hsdp::strCat(flag, " set ", k)));
    for (const std::string& h : hosts)
      if (!validHost(h))
        return hsdp::invalidArgument(flag, " '", text, "': '", h, "' in host set ", k,
                                     " is not a host name ([A-Za-z0-9_.:-]+)");
    sets.push_back(std::move(hosts));
  }
  return sets;
}

// The launcher named by --launcher ("mpirun", "srun", or a path to one), found in PATH. A name
// that starts with mpirun or mpiexec is an mpirun (mpirun.openmpi, scripts/mpirun-local).
StatusOr<std::string> findLauncher(const std::string& name, LauncherKind* kind) {
  const std::string base = name.substr(name.find_last_of('/') + 1);
  if (base.rfind("mpirun", 0) == 0 || base.rfind("mpiexec", 0) == 0)
    *kind = LauncherKind::kMpirun;
  else if (base == "srun")
    *kind = LauncherKind::kSrun;
  else
    return hsdp::invalidArgument("--launcher '", name, "' is not mpirun or srun");
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    return hsdp::invalidArgument("--launcher '", name, "' is not an executable file");
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;  // never the working directory by accident
    if (executable(dir + "/" + name)) return dir + "/" + name;
  }
  return hsdp::invalidArgument("--launcher ", name, ": '", name, "' is not in PATH");
}

// The flags checked together and turned into the plan (everything a single flag's parser could
// not see: the program, the host sets against --groups, the names).
StatusOr<Plan> makePlan(const Flags& f, std::vector<std::string> program) {
  Plan p;
  if (program.empty())
    return hsdp::invalidArgument(
        "no program to run: give it after '--' (hsdp-elastic --groups N --np K -- program "
        "[args...])");
  p.program = std::move(program);
  p.groups = f.groups;
  p.np = f.np;
  p.max_restarts = f.max_restarts;
  p.grace_s = f.grace_s;
  p.endpoint = f.endpoint;
  // One URL, or a comma list of an etcd cluster's members (the client fails over among them).
  std::stringstream urls(f.endpoint);
  for (std::string url; !f.endpoint.empty() && std::getline(urls, url, ',');) {
    const size_t scheme = url.find("://");
    const std::string s = scheme == std::string::npos ? "" : url.substr(0, scheme);
    if ((s != "http" && s != "https") || url.size() == scheme + 3 ||
        url.find_first_of(" \t\n") != std::string::npos)
      return url == f.endpoint
                 ? hsdp::invalidArgument("--endpoint '", f.endpoint,
                                         "' is not an etcd URL (http://host:port)")
                 : hsdp::invalidArgument("--endpoint '", f.endpoint, "': '", url,
                                         "' is not an etcd URL (http://host:port,http://...)");
  }
  if (!f.endpoint.empty() && f.endpoint.back() == ',')
    return hsdp::invalidArgument("--endpoint '", f.endpoint, "' ends with an empty URL");
  p.job = f.job.empty() ? hsdp::strCat("hsdp-", ::getpid()) : f.job;
  if (!hsdp::elastic::Quorum::validName(p.job))
    return hsdp::invalidArgument("--job '", p.job, "' is not a job name ([A-Za-z0-9_.-]+, ",
                                 "at most 128 characters)");
  HSDP_ASSIGN_OR_RETURN(p.launcher_path, findLauncher(f.launcher, &p.kind));
  std::stringstream words(f.launcher_args);
  for (std::string w; words >> w;) p.launcher_args.push_back(w);
  if (!f.group_hosts.empty()) {
    HSDP_ASSIGN_OR_RETURN(p.group_hosts, parseHostSets(f.group_hosts, "--group-hosts"));
    if (static_cast<int>(p.group_hosts.size()) != p.groups)
      return hsdp::invalidArgument("--group-hosts '", f.group_hosts, "' names ",
                                   p.group_hosts.size(), " host sets; --groups is ", p.groups,
                                   " (one set per group)");
  }
  if (!f.spare_hosts.empty()) {
    HSDP_ASSIGN_OR_RETURN(p.spare_hosts, parseHostSets(f.spare_hosts, "--spare-hosts"));
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after the first "--" is the program's; CLI11 sees only what comes before. A value
  // of --launcher-args starts with '-' as a rule, which CLI11 would take for a flag: it is joined
  // to its flag ("--launcher-args=VALUE") first.
  std::vector<std::string> ours = {argv[0]}, program;
  bool in_program = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (in_program) {
      program.push_back(a);
    } else if (a == "--") {
      in_program = true;
    } else if (a == "--launcher-args" && i + 1 < argc) {
      ours.push_back(a + "=" + argv[++i]);
    } else {
      ours.push_back(a);
    }
  }

  Flags f;
  CLI::App app{
      "hsdp-elastic: starts the replica groups of one elastic job (one mpirun or srun each), "
      "restarts a failed group while the others go on, and stops everything at the end.\n"
      "  hsdp-elastic --groups N --np K [flags] -- program [args...]"};
  namespace cli = hsdp::cli;
  cli::addInt(app, "--groups", f.groups, "replica groups N (each its own MPI job)", 1, 4096)
      ->required();
  cli::addInt(app, "--np", f.np, "ranks per group K", 1, 1 << 20)->required();
  app.add_option(
      "--endpoint", f.endpoint,
      "etcd URL, or a comma list of an etcd cluster's members (default: a local etcd for the job)");
  app.add_option("--job", f.job, "job name, [A-Za-z0-9_.-]+ (default: hsdp-<pid>)");
  cli::addInt(app, "--max-restarts", f.max_restarts, "restarts allowed per group", 0, 1000000);
  app.add_option("--launcher", f.launcher, "mpirun or srun (a name in PATH or a path)");
  app.add_option("--launcher-args", f.launcher_args,
                 "extra launcher arguments, split at whitespace (no quoting)");
  app.add_option("--group-hosts", f.group_hosts,
                 "one host set per group: \"h0,h1;h2,h3;...\" (mpirun --host / srun --nodelist)");
  app.add_option("--spare-hosts", f.spare_hosts,
                 "host sets a restarted group moves to, in order: \"h6,h7;...\"");
  cli::addReal(app, "--grace", f.grace_s, "seconds between SIGTERM and SIGKILL when stopping",
               hsdp::RealRange::closed(0, 3600));
  try {
    std::vector<const char*> args;
    for (const std::string& a : ours) args.push_back(a.c_str());
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return cli::reportParseError(app, e, "hsdp-elastic");
  }
  StatusOr<Plan> plan = makePlan(f, std::move(program));
  if (!plan.ok()) {
    std::fprintf(stderr, "hsdp-elastic: error: %s\n", plan.status().message().c_str());
    return cli::kExitBadInput;
  }
  if (!hsdp::elastic_launch::installSignalHandlers()) {
    std::perror("hsdp-elastic: error: installing the signal handlers");
    return cli::kExitRuntime;
  }

  std::unique_ptr<hsdp::elastic::LocalEtcd> etcd;  // its destructor stops it on every way out
  if (plan->endpoint.empty()) {
    auto started = hsdp::elastic::LocalEtcd::start();
    if (!started.ok()) {
      std::fprintf(stderr, "hsdp-elastic: error: the local etcd: %s\n",
                   started.status().message().c_str());
      return cli::kExitRuntime;
    }
    etcd = std::move(*started);
    plan->endpoint = etcd->endpoint();
  } else {
    // A coordinator that does not answer is named now, in a bounded time, not by every group.
    hsdp::elastic::EtcdClient::Options copt;
    copt.timeout_ms = 5000;
    auto client = hsdp::elastic::EtcdClient::create(plan->endpoint, copt);
    hsdp::Status s =
        client.ok() ? (*client)->get("/hsdp/" + plan->job + "/config").status() : client.status();
    if (!s.ok()) {
      std::fprintf(stderr, "hsdp-elastic: error: --endpoint '%s' does not answer: %s\n",
                   plan->endpoint.c_str(), s.message().c_str());
      return cli::kExitBadInput;
    }
  }
  std::fprintf(stderr, "hsdp-elastic: job %s, %d groups x %d ranks, coordinator %s (%s)\n",
               plan->job.c_str(), plan->groups, plan->np, plan->endpoint.c_str(),
               etcd ? "local etcd" : "given");
  std::fflush(stderr);
  int rc;
  if (int sig = hsdp::elastic_launch::pendingSignal())  // while etcd was starting
    rc = 128 + sig;
  else
    rc = hsdp::elastic_launch::superviseGroups(*plan, etcd ? etcd->pid() : -1);
  etcd.reset();
  return rc;
}
