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
