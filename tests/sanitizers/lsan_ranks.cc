// LeakSanitizer's exit-time check on two ranks of an MPI job, not on every rank (ASan trees only:
// cmake/HsdpSanitize.cmake links this file into every executable of such a tree).
//
// The check costs about 1.7 s of CPU per rank at exit (docs/design.md, "Where CI's time goes"),
// most of the ASan pass's MPI jobs run 6-10 ranks on the CI's 2 cores, and the ranks of one job
// run the same program: rank 0 (world root, first node's leader) and the last rank (a non-leader
// of the last node) take both roles every other rank has. A process outside mpirun (the unit tests,
// the tools, single-process programs) checks as before. An explicit detect_leaks in ASAN_OPTIONS
// or LSAN_OPTIONS overrides this default (those are parsed after it), so
// `ASAN_OPTIONS=detect_leaks=1` checks every rank again.
#include <cstdlib>

namespace {
long envLong(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' ? n : -1;
}
}  // namespace

// The sanitizer runtime's weak hook, read once at start-up before main.
extern "C" const char* __lsan_default_options() {
  const long rank = envLong("OMPI_COMM_WORLD_RANK");
  const long size = envLong("OMPI_COMM_WORLD_SIZE");
  if (rank < 0 || size < 0 || rank == 0 || rank == size - 1) return "";
  return "detect_leaks=0";
}
