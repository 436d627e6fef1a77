# The libFuzzer rule of the test suite (included by tests/CMakeLists.txt; used by tests/core,
# tests/topology and tests/storage).
#
# hsdp_fuzz_test(NAME test BINARY bin SOURCES src... SEEDS file-or-glob... SECONDS s
#                [SANITIZE address,undefined] [FLAGS cflag...] [LINK lflag...] [ARGS arg...]
#                [ENV VAR=value...])
# A libFuzzer target and its bounded test (labels unit and fuzz): clang++ -fsanitize=fuzzer plus
# SANITIZE (default: address) over SOURCES, one object per source (hsdp_fuzz_object: shared
# between fuzzers; ninja builds them side by side with the rest), linked into
# build/<this folder>/<bin>. The test copies the seeds into a private corpus (libFuzzer adds new entries to its first directory) and runs with -seed=1 for
# SECONDS plus ARGS; on a failure it prints the sanitizer's report. For longer (README.md):
# cd build/<folder> && ./<bin> -max_total_time=600 corpus/
# Skipped, with a message, where clang++ or its libFuzzer runtime is missing.
find_program(HSDP_CLANGXX NAMES clang++ clang++-14)
set(HSDP_FUZZ_RT "")
if(HSDP_CLANGXX)
  execute_process(COMMAND ${HSDP_CLANGXX} -print-file-name=libclang_rt.fuzzer-x86_64.a
                  OUTPUT_VARIABLE HSDP_FUZZ_RT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
# hsdp_fuzz_object(<obj var> <target var> src sanitize flags): the object of one source under
# one set of sanitizers and flags, compiled once for every fuzzer that names it (the readers'
# library sources, core/json.cc, status.cc, files.cc, dir.cc: shared by the topology and the
# checkpoint fuzzers), in build/fuzz.objs/<key>/: the key is the sanitizers and the flags other
# than include directories (-I/-isystem: they change no object of a source that does not include
# from them, and the first fuzzer to name a source compiles it with its own). <target var>: the custom target that builds it
# (a fuzzer in another folder depends on it; Ninja has one graph, the object's path suffices there,
# the target orders it for the other generators). -gline-tables-only: the reports' file:line
# (all a fuzzer's report shows) for less compile time than -g (safetensors.cc: 14.1 s against
# 16.2 s).
function(hsdp_fuzz_object out_obj out_tgt src sanitize flags)
  file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} ${src})
  set(_code_flags ${flags})
  list(FILTER _code_flags EXCLUDE REGEX "^-(I|isystem)")
  string(MAKE_C_IDENTIFIER "${sanitize} ${_code_flags}" _key)
  string(MD5 _key "${_key}")
  string(SUBSTRING ${_key} 0 8 _key)
  string(MAKE_C_IDENTIFIER "${_rel}" _stem)
  set(_dir ${PROJECT_BINARY_DIR}/fuzz.objs/${_key})
  set(_obj ${_dir}/${_stem}.o)
  set(_tgt fuzzobj_${_key}_${_stem})
  if(NOT TARGET ${_tgt})
    add_custom_command(OUTPUT ${_obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${_dir}
      COMMAND ${HSDP_CLANGXX} -std=c++20 -O1 -gline-tables-only -fsanitize=fuzzer-no-link,${sanitize}
              ${flags} -I${PROJECT_SOURCE_DIR} -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/include
              -MD -MF ${_obj}.d -c ${src} -o ${_obj}
      DEPENDS ${src} DEPFILE ${_obj}.d VERBATIM)
    add_custom_target(${_tgt} DEPENDS ${_obj})
  endif()
  set(${out_obj} ${_obj} PARENT_SCOPE)
  set(${out_tgt} ${_tgt} PARENT_SCOPE)
endfunction()

function(hsdp_fuzz_test)
  cmake_parse_arguments(F "" "NAME;BINARY;SECONDS;SANITIZE"
                        "SOURCES;SEEDS;FLAGS;LINK;ARGS;ENV" ${ARGN})
  if(NOT HSDP_CLANGXX OR NOT EXISTS "${HSDP_FUZZ_RT}")
    message(STATUS "${F_NAME}: clang++ with libFuzzer not found, fuzz test skipped")
    return()
  endif()
  if(NOT F_SANITIZE)
    set(F_SANITIZE address)
  endif()
  set(_bin ${CMAKE_CURRENT_BINARY_DIR}/${F_BINARY})
  set(_objs)
  set(_deps)
  foreach(_src ${F_SOURCES})
    hsdp_fuzz_object(_obj _tgt "${_src}" "${F_SANITIZE}" "${F_FLAGS}")
    list(APPEND _objs ${_obj})
    list(APPEND _deps ${_tgt})
  endforeach()
  add_custom_command(OUTPUT ${_bin}
    COMMAND ${HSDP_CLANGXX} -fsanitize=fuzzer,${F_SANITIZE} ${_objs} -o ${_bin} ${F_LINK}
    DEPENDS ${_objs} VERBATIM)
  add_custom_target(${F_BINARY}er ALL DEPENDS ${_bin})
  add_dependencies(${F_BINARY}er ${_deps})
  list(JOIN F_SEEDS " " _seeds)
  list(JOIN F_ARGS " " _args)
  list(JOIN F_ENV " " _env)
  add_test(NAME ${F_NAME}
    COMMAND sh -c "rm -rf corpus && mkdir corpus && cp ${_seeds} corpus/ && ${_env} ${_bin} -seed=1 -max_total_time=${F_SECONDS} ${_args} -print_final_stats=1 corpus 2>fuzz.log; rc=$?; if [ $rc -ne 0 ]; then grep -a -B3 -A40 -E '==ERROR|deadly signal|SUMMARY:|${F_BINARY}:' fuzz.log | head -120; ls crash-* timeout-* oom-* 2>/dev/null; fi; tail -5 fuzz.log; exit $rc"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${F_NAME} PROPERTIES LABELS "unit;fuzz" TIMEOUT 120 COST 30)
endfunction()
