# Precompiled headers (option HSDP_PCH, ON): the standard library, MPI and, for the tests,
# GoogleTest are parsed once per target instead of once per source file.
#   - the library: hsdp_pch_library() (its own PCH; the ISA kernels' object libraries, with
#     their own -m flags, have none);
#   - the tests: hsdp_pch_tests(<targets>) makes each GoogleTest binary reuse the one PCH of
#     hsdp_test_pch (REUSE_FROM), except those with definitions or options of their own (a
#     PCH is only valid for the flags it was built with: clang refuses it, GCC ignores it).
# Measured (GCC 12, Release, CPU seconds of a clean build): docs/design.md, "Build time".
# A PCH is included first in every source (-include), so a source that forgets an #include of
# the standard library still compiles here; the TSan tree (scripts/sanitize) builds without PCH
# and keeps that check. ccache caches PCH builds only with sloppiness pch_defines,time_macros:
# set here for ccache as the launcher (CI builds without ccache).
option(HSDP_PCH "Precompiled headers for the library and the tests" ON)
if(HSDP_PCH AND CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache" AND
   NOT CMAKE_CXX_COMPILER_LAUNCHER MATCHES "SLOPPINESS")
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()

set(HSDP_PCH_STD <algorithm> <atomic> <chrono> <cmath> <cstdint> <cstdio> <cstdlib> <cstring>
                 <functional> <map> <memory> <mutex> <optional> <span> <string> <string_view>
                 <thread> <unordered_map> <utility> <vector> <mpi.h>)

function(hsdp_pch_library)
  if(HSDP_PCH)
    target_precompile_headers(hsdp PRIVATE ${HSDP_PCH_STD})  # CXX only (CMake: not CUDA)
  endif()
endfunction()

# hsdp_pch_tests(<target>...): after every test target exists (the end of tests/CMakeLists.txt).
function(hsdp_pch_tests)
  if(NOT HSDP_PCH)
    return()
  endif()
  add_library(hsdp_test_pch STATIC ${PROJECT_SOURCE_DIR}/tests/common/pch.cc)
  target_link_libraries(hsdp_test_pch PRIVATE hsdp GTest::gtest)
  target_precompile_headers(hsdp_test_pch PRIVATE ${HSDP_PCH_STD} <filesystem> <fstream> <random>
                            <set> <sstream> <gtest/gtest.h>)
  get_target_property(pch_opts hsdp_test_pch COMPILE_OPTIONS)  # the folder's (-O1)
  foreach(t ${ARGN})
    get_target_property(defs ${t} COMPILE_DEFINITIONS)
    get_target_property(opts ${t} COMPILE_OPTIONS)
    get_target_property(libs ${t} LINK_LIBRARIES)
    if(defs OR NOT "${opts}" STREQUAL "${pch_opts}" OR "hsdp_example_isa" IN_LIST libs)
      continue()
    endif()
    target_precompile_headers(${t} REUSE_FROM hsdp_test_pch)
  endforeach()
endfunction()
