# hsdp_isa_kernels(<name> <define> [flags...]): SIMD kernels built once per ISA, each as an object
# library with its own target flags, linked into libhsdp: <name>_scalar.cc always, and on x86-64
# <name>_avx2.cc (-mavx2) and <name>_avx512.cc (-mavx512f), with <define>=1 for them and for
# libhsdp (the dispatcher's #if). Why not the flags on the whole library: code compiled with
# -mavx512f may use AVX-512 anywhere and would crash on CPUs without it, so only the run-time
# dispatcher (baseline flags) decides which object executes. The targets are hsdp_<name>_<isa>
# (tests check their symbols: only the entry point may be external).
function(hsdp_isa_kernels name define)
  set(kernels scalar)
  set(x86 OFF)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(x86 ON)
    list(APPEND kernels avx2 avx512)
    target_compile_definitions(hsdp PRIVATE ${define}=1)
  endif()
  set(isa_flags_scalar "")
  set(isa_flags_avx2 -mavx2)
  set(isa_flags_avx512 -mavx512f)
  foreach(isa ${kernels})
    set(target hsdp_${name}_${isa})
    add_library(${target} OBJECT ${name}_${isa}.cc)
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src
                               ${PROJECT_SOURCE_DIR}/include)
    target_compile_options(${target} PRIVATE ${ARGN} ${isa_flags_${isa}})
    if(x86)
      target_compile_definitions(${target} PRIVATE ${define}=1)
    endif()
    target_sources(hsdp PRIVATE $<TARGET_OBJECTS:${target}>)
  endforeach()
endfunction()
