# Sanitizer builds (scripts/test --sanitize, CMakePresets.json's asan and tsan presets):
#   -DHSDP_SANITIZE=address,undefined   AddressSanitizer + UndefinedBehaviorSanitizer; UB aborts
#                                       (-fno-sanitize-recover) so a report fails its test
#   -DHSDP_SANITIZE=thread              ThreadSanitizer
# Host code only: nvcc does not take these flags (configure sanitizer builds with
# HSDP_WITH_CUDA=OFF). Suppressions for the foreign libraries: tests/sanitizers/.
set(HSDP_SANITIZE "" CACHE STRING "Sanitizers for every host target: address,undefined | thread | empty")
if(HSDP_SANITIZE)
  string(REPLACE ";" "," _hsdp_san "${HSDP_SANITIZE}")
  if(NOT _hsdp_san MATCHES "^(address|undefined|address,undefined|undefined,address|thread)$")
    message(FATAL_ERROR "HSDP_SANITIZE='${HSDP_SANITIZE}' is not one of address,undefined | thread")
  endif()
  # Line tables are enough for symbolized reports (-g1: a quarter of -g's compile time and
  # memory); a Debug build keeps its full -g.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_hsdp_san}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  if(NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-g1>)
  endif()
  if(_hsdp_san MATCHES "undefined")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  endif()
  add_link_options(-fsanitize=${_hsdp_san})
  message(STATUS "hsdp: sanitizers ${_hsdp_san}")
endif()

# ASan trees: every executable links tests/sanitizers/lsan_ranks.cc, LeakSanitizer's default
# options (its exit-time check on rank 0 and the last rank of an MPI job; every process outside
# mpirun checks as before). Called at the end of the top-level CMakeLists.txt, once every target
# exists: it walks the directories' targets.
function(_hsdp_lsan_ranks_link dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      set_property(TARGET ${t} APPEND PROPERTY LINK_LIBRARIES hsdp_lsan_ranks)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(s ${subdirs})
    _hsdp_lsan_ranks_link(${s})
  endforeach()
endfunction()
function(hsdp_sanitizer_hooks)
  if(_hsdp_san MATCHES "address")
    add_library(hsdp_lsan_ranks OBJECT ${PROJECT_SOURCE_DIR}/tests/sanitizers/lsan_ranks.cc)
    set_target_properties(hsdp_lsan_ranks PROPERTIES DISABLE_PRECOMPILE_HEADERS ON)
    _hsdp_lsan_ranks_link(${PROJECT_SOURCE_DIR})
  endif()
endfunction()
