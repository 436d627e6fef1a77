# Compile through ccache when it is installed (scripts/setup installs it) and no launcher was
# chosen: a clean clone's builds (scripts/test builds the release tree and two sanitizer trees,
# CI starts from a clean clone every time) then reuse the objects of earlier builds of the same
# sources wherever the clone lies (CCACHE_BASEDIR: paths below the source tree hash as relative
# ones). A cold cache costs a few percent; -DHSDP_CCACHE=OFF compiles without it.
option(HSDP_CCACHE "Compile through ccache when it is installed" ON)
if(HSDP_CCACHE)
  find_program(HSDP_CCACHE_PROGRAM ccache)
  if(HSDP_CCACHE_PROGRAM)
    foreach(lang C CXX CUDA)
      if(NOT CMAKE_${lang}_COMPILER_LAUNCHER AND NOT DEFINED ENV{CMAKE_${lang}_COMPILER_LAUNCHER})
        set(CMAKE_${lang}_COMPILER_LAUNCHER
            "${CMAKE_COMMAND};-E;env;CCACHE_BASEDIR=${PROJECT_SOURCE_DIR};CCACHE_SLOPPINESS=pch_defines,time_macros;${HSDP_CCACHE_PROGRAM}")
      endif()
    endforeach()
  endif()
endif()
