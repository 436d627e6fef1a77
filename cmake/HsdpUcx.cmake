# The UCX transport is optional like CUDA: HSDP_WITH_UCX=AUTO (built when UCX's pkg-config module
# is found), ON (required) or OFF. Sets HSDP_HAVE_UCX. Debian/Ubuntu: libucx-dev.
set(HSDP_HAVE_UCX OFF)
hsdp_optional_mode(HSDP_WITH_UCX _hsdp_ucx_mode)
if(NOT _hsdp_ucx_mode STREQUAL "OFF")
  pkg_check_modules(UCX QUIET IMPORTED_TARGET ucx)
  if(UCX_FOUND)
    set(HSDP_HAVE_UCX ON)
  endif()
endif()
hsdp_optional_report(HSDP_WITH_UCX ${_hsdp_ucx_mode} ${HSDP_HAVE_UCX} "UCX ${UCX_VERSION} found"
                     "UCX's pkg-config module 'ucx' was not found (Debian: libucx-dev)"
                     "UCX not found; building without the UCX transport")
