# The libFuzzer rule of the test suite (included by tests/CMakeLists.txt; used by tests/core,
# tests/topology and tests/storage).
#
# hsdp_fuzz_test(NAME test BINARY bin SOURCES src... SEEDS file-or-glob... SECONDS s
#                [SANITIZE address,undefined] [FLAGS cflag...] [LINK lflag...] [ARGS arg...]
#                [ENV VAR=value...])
# A libFuzzer target and its bounded test (labels unit and fuzz): clang++ -fsanitize=fuzzer plus
# SANITIZE (default: address) over SOURCES, one object per source (ninja builds them side by
# side with the rest), linked into build/<this folder>/<bin>. The test copies the seeds into a
# private corpus (libFuzzer adds new entries to its first directory) and runs with -seed=1 for
# SECONDS plus ARGS; on a failure it prints the sanitizer's report. For longer (README.md):
# cd build/<folder> && ./<bin> -max_total_time=600 corpus/
# Skipped, with a message, where clang++ or its libFuzzer runtime is missing.
find_program(HSDP_CLANGXX NAMES clang++ clang++-14)
set(HSDP_FUZZ_RT "")
if(HSDP_CLANGXX)
  execute_process(COMMAND ${HSDP_CLANGXX} -print-file-name=libclang_rt.fuzzer-x86_64.a
                  OUTPUT_VARIABLE HSDP_FUZZ_RT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
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
  set(_dir ${CMAKE_CURRENT_BINARY_DIR}/${F_BINARY}.objs)
  set(_objs)
  foreach(_src ${F_SOURCES})
    get_filename_component(_stem ${_src} NAME_WE)  # unique within a target
    set(_obj ${_dir}/${_stem}.o)
    add_custom_command(OUTPUT ${_obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${_dir}
      COMMAND ${HSDP_CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer-no-link,${F_SANITIZE}
              ${F_FLAGS} -I${PROJECT_SOURCE_DIR} -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/include
              -MD -MF ${_obj}.d -c ${_src} -o ${_obj}
      DEPENDS ${_src} DEPFILE ${_obj}.d VERBATIM)
    list(APPEND _objs ${_obj})
  endforeach()
  add_custom_command(OUTPUT ${_bin}
    COMMAND ${HSDP_CLANGXX} -fsanitize=fuzzer,${F_SANITIZE} ${_objs} -o ${_bin} ${F_LINK}
    DEPENDS ${_objs} VERBATIM)
  add_custom_target(${F_BINARY}er ALL DEPENDS ${_bin})
  list(JOIN F_SEEDS " " _seeds)
  list(JOIN F_ARGS " " _args)
  list(JOIN F_ENV " " _env)
  add_test(NAME ${F_NAME}
    COMMAND sh -c "rm -rf corpus && mkdir corpus && cp ${_seeds} corpus/ && ${_env} ${_bin} -seed=1 -max_total_time=${F_SECONDS} ${_args} -print_final_stats=1 corpus 2>fuzz.log; rc=$?; if [ $rc -ne 0 ]; then grep -a -B3 -A40 -E '==ERROR|deadly signal|SUMMARY:|${F_BINARY}:' fuzz.log | head -120; ls crash-* timeout-* oom-* 2>/dev/null; fi; tail -5 fuzz.log; exit $rc"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${F_NAME} PROPERTIES LABELS "unit;fuzz" TIMEOUT 120 COST 30)
endfunction()
