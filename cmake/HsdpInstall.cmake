# Install rules and the CMake package (find_package(hsdp)), plus a pkg-config file.
#
#   cmake --install build --prefix /opt/hsdp
#   # a user's CMakeLists.txt:
#   find_package(hsdp 0.2 REQUIRED)                 # or: REQUIRED COMPONENTS CUDA
#   target_link_libraries(my_trainer PRIVATE hsdp::hsdp)
#   find_package(hsdp 0.2 REQUIRED COMPONENTS CLI)  # the programs' flags: hsdp::cli (CLI11)
#
# What is installed: libhsdp (static by default, shared with -DBUILD_SHARED_LIBS=ON), every
# public header (include/hsdp/, the generated hsdp/version.h; a module's private headers, such as
# core/host_buffer.h, stay in the tree), the tools that were built
# (hsdp-env, hsdp-topo, hsdp-plan, ...), lib/cmake/hsdp/{hsdpConfig,hsdpConfigVersion,
# hsdpTargets,hsdpCliTargets}.cmake and lib/pkgconfig/hsdp.pc. The package's components are the
# optional modules (CUDA, UCX) and CLI (hsdp::cli: hsdp/cli.h and hsdp/flags.h, the flags hsdp's
# programs share, on CLI11): asking for one this build lacks fails find_package with the reason.
include(CMakePackageConfigHelpers)

install(TARGETS hsdp EXPORT hsdpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/hsdp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/hsdp/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hsdp)
foreach(tool hsdp-env hsdp-topo hsdp-plan hsdp-ckpt hsdp-elastic hsdp-bench)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(HSDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hsdp)
install(EXPORT hsdpTargets NAMESPACE hsdp:: DESTINATION ${HSDP_CMAKE_DIR})
# The CLI component: header-only (its headers are installed with the others), on CLI11. An export
# set of its own, which hsdpConfig.cmake includes only when asked for (COMPONENTS CLI), after
# finding CLI11: a program that does not ask needs no CLI11.
if(TARGET hsdp_cli)
  install(TARGETS hsdp_cli EXPORT hsdpCliTargets)
  install(EXPORT hsdpCliTargets NAMESPACE hsdp:: DESTINATION ${HSDP_CMAKE_DIR})
  set(HSDP_PKG_WITH_CLI ON)
else()
  set(HSDP_PKG_WITH_CLI OFF)
endif()

# What hsdpConfig.cmake needs to know about this build (cmake/hsdpConfig.cmake.in).
get_target_property(_hsdp_type hsdp TYPE)
if(_hsdp_type STREQUAL "STATIC_LIBRARY")
  set(HSDP_PKG_STATIC ON)
else()
  set(HSDP_PKG_STATIC OFF)
endif()
set(HSDP_PKG_WITH_CUDA ${HSDP_HAVE_CUDA})
set(HSDP_PKG_WITH_UCX ${HSDP_HAVE_UCX})
set(HSDP_PKG_CUDA_ROOT "")
set(HSDP_PKG_NCCL_LIBRARY "")
set(HSDP_PKG_NCCL_INCLUDE_DIR "")
if(HSDP_HAVE_CUDA)
  get_filename_component(HSDP_PKG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  set(HSDP_PKG_NCCL_LIBRARY ${HSDP_NCCL_LIBRARY})
  set(HSDP_PKG_NCCL_INCLUDE_DIR ${HSDP_NCCL_INCLUDE_DIR})
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/hsdpConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/package/hsdpConfig.cmake
                              INSTALL_DESTINATION ${HSDP_CMAKE_DIR})
# 0.x: minor versions may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/hsdpConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/hsdpConfig.cmake
              ${PROJECT_BINARY_DIR}/package/hsdpConfigVersion.cmake
        DESTINATION ${HSDP_CMAKE_DIR})

# pkg-config: hsdp.pc (`pkg-config --cflags --libs hsdp`). MPI has no portable pkg-config module,
# so its flags come from FindMPI. hwloc, xxHash, libxml2, libcurl (and UCX) are what libhsdp links
# privately: Requires.private of a shared libhsdp; of the static archive, plain Requires, since
# every program that links the archive links them too (and `--static` would also pull in their
# own static-only dependencies, such as hwloc's libudev).
set(HSDP_PC_MPI_CFLAGS "")
foreach(dir ${MPI_CXX_INCLUDE_DIRS})
  string(APPEND HSDP_PC_MPI_CFLAGS " -I${dir}")
endforeach()
set(HSDP_PC_MPI_LIBS "")
foreach(lib ${MPI_CXX_LIBRARIES})
  string(APPEND HSDP_PC_MPI_LIBS " ${lib}")
endforeach()
set(HSDP_PC_REQUIRES_PRIVATE "hwloc libxxhash libxml-2.0 libcurl")
set(HSDP_PC_LIBS_PRIVATE "-lpthread")
foreach(lib ${CMAKE_DL_LIBS})
  string(APPEND HSDP_PC_LIBS_PRIVATE " -l${lib}")
endforeach()
if(HSDP_HAVE_UCX)
  string(APPEND HSDP_PC_REQUIRES_PRIVATE " ucx")
endif()
set(HSDP_PC_CUDA_CFLAGS "")
set(HSDP_PC_CUDA_LIBS "")
if(HSDP_HAVE_CUDA)
  foreach(dir ${CUDAToolkit_INCLUDE_DIRS})
    string(APPEND HSDP_PC_CUDA_CFLAGS " -I${dir}")
  endforeach()
  set(HSDP_PC_CUDA_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
  string(APPEND HSDP_PC_LIBS_PRIVATE " ${HSDP_NCCL_LIBRARY}")
endif()
if(HSDP_PKG_STATIC)
  set(HSDP_PC_REQUIRES "${HSDP_PC_REQUIRES_PRIVATE}")
  set(HSDP_PC_REQUIRES_PRIVATE "")
  set(HSDP_PC_LIBS "${HSDP_PC_LIBS_PRIVATE} -lstdc++")
  set(HSDP_PC_LIBS_PRIVATE "")
else()
  set(HSDP_PC_REQUIRES "")
  set(HSDP_PC_LIBS "")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/hsdp.pc.in ${PROJECT_BINARY_DIR}/package/hsdp.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/hsdp.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
