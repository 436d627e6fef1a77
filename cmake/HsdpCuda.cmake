# The CUDA side of the build. Detects CUDA and NCCL for HSDP_WITH_CUDA=AUTO|ON|OFF and sets
# HSDP_HAVE_CUDA; when it is ON, enables the CUDA language, defines the imported target hsdp::nccl
# (collectives/nccl/ and src/cuda/ then add the NCCL transport and the CUDA memory space to
# libhsdp, so programs link `hsdp` alone). Nothing here changes the host (MPI) path: HSDP_WITH_CUDA=OFF builds the rest.
#
# NCCL: /usr/local/cuda (the toolkit's own copy), NCCL_HOME, or given explicitly, e.g. the pip
# package nvidia-nccl-cu13 (which ships only libnccl.so.2, hence the second name):
#   -DHSDP_NCCL_INCLUDE_DIR=<site-packages>/nvidia/nccl/include
#   -DHSDP_NCCL_LIBRARY=<site-packages>/nvidia/nccl/lib/libnccl.so.2
set(HSDP_HAVE_CUDA OFF)
hsdp_optional_mode(HSDP_WITH_CUDA _hsdp_cuda_mode)
if(NOT _hsdp_cuda_mode STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(HSDP_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include $ENV{NCCL_HOME}/include)
  find_library(HSDP_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 $ENV{NCCL_HOME}/lib)
  if(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE AND HSDP_NCCL_INCLUDE_DIR
     AND HSDP_NCCL_LIBRARY)
    set(HSDP_HAVE_CUDA ON)
  endif()
endif()
string(CONCAT _hsdp_cuda_missing "CUDA toolkit (found=${CUDAToolkit_FOUND}, "
              "nvcc=${CUDAToolkit_NVCC_EXECUTABLE}) or NCCL (include=${HSDP_NCCL_INCLUDE_DIR}, "
              "lib=${HSDP_NCCL_LIBRARY}) is missing")
hsdp_optional_report(HSDP_WITH_CUDA ${_hsdp_cuda_mode} ${HSDP_HAVE_CUDA}
                     "CUDA ${CUDAToolkit_VERSION} and NCCL (${HSDP_NCCL_LIBRARY}) found"
                     "${_hsdp_cuda_missing}" "CUDA/NCCL not found; building the host (MPI) path only")

if(HSDP_HAVE_CUDA)
  # sm_80 (A100) and sm_90 (H100/H200) as machine code, plus compute_90 PTX that newer GPUs
  # compile at load time. Every entry is one more device compile of every .cu file, so the list
  # is exactly that (CI builds on 2 cores); -DCMAKE_CUDA_ARCHITECTURES=90-real narrows it for a
  # quick local build. Set before enable_language: CMake would otherwise probe nvcc's default
  # architecture, which older CMake releases get wrong for CUDA 13.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
  endif()
  if(NOT DEFINED CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})  # nvcc need not be on PATH
  endif()
  # The shared CUDA runtime, as CUDA::cudart (public: hsdp/nccl.h names CUDA types) already links
  # it; CMake's default would add cudart_static beside it, two runtimes in one process.
  if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  endif()
  enable_language(CUDA)
  # C++17 for device code: CMake 3.25 does not know how to ask nvcc for C++20, and the .cu files
  # include only headers that are C++17 (status, dtype, optimizer).
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)

  add_library(hsdp::nccl UNKNOWN IMPORTED)
  set_target_properties(hsdp::nccl PROPERTIES
    IMPORTED_LOCATION ${HSDP_NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${HSDP_NCCL_INCLUDE_DIR})

endif()
