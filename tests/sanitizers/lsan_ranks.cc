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
// The initial stack's argc, set by the dynamic loader before any start-up code runs (glibc).
extern "C" void* __libc_stack_end;

namespace {
// The runtime calls the hook from its own start-up (the executable's preinit, before libc's own
// initialisation), before its shadow memory and interceptors are set up: nothing here may be
// instrumented or call libc (strtol is intercepted), and libc's environ is not set yet. So the
// environment is read where the kernel put it, after argv on the initial stack, as the
// sanitizer runtime itself finds it.
__attribute__((no_sanitize("address", "undefined"))) long envLong(const char* name) {
  auto* stack = static_cast<unsigned long*>(__libc_stack_end);
  if (stack == nullptr) return -1;
  const auto argc = static_cast<int>(stack[0]);
  for (char** e = reinterpret_cast<char**>(stack + argc + 2); *e != nullptr; ++e) {
    const char* p = *e;
    const char* n = name;
    while (*n != '\0' && *p == *n) {
      ++p;
      ++n;
    }
    if (*n != '\0' || *p != '=') continue;
    long v = 0;
    for (++p; *p >= '0' && *p <= '9'; ++p) v = v * 10 + (*p - '0');
    return *p == '\0' && p[-1] != '=' ? v : -1;
  }
  return -1;
}
}  // namespace

// The sanitizer runtime's weak hook, read once at start-up before main.
extern "C" __attribute__((no_sanitize("address", "undefined"))) const char*
__lsan_default_options() {
  const long rank = envLong("OMPI_COMM_WORLD_RANK");
  const long size = envLong("OMPI_COMM_WORLD_SIZE");
  if (rank < 0 || size < 0 || rank == 0 || rank == size - 1) return "";
  return "detect_leaks=0";
}
