# Modules register themselves by name (transports, the CUDA memory space) through the registries
# in core/ (include/hsdp/transport_registry.h), so the engine never names a backend. A static
# library drops object files nothing references, so a self-registering static initializer would
# be lost; instead each module folder appends its registration function to the global property
# HSDP_MODULES (and a module that was not built, its reason to HSDP_MODULES_MISSING), and this
# file writes one function that calls them all, which the registries call once on first use.
get_property(_hsdp_modules GLOBAL PROPERTY HSDP_MODULES)
get_property(_hsdp_missing GLOBAL PROPERTY HSDP_MODULES_MISSING)
set(HSDP_MODULE_DECLS "")
set(HSDP_MODULE_CALLS "")
foreach(fn ${_hsdp_modules})
  string(APPEND HSDP_MODULE_DECLS "void ${fn}();\n")
  string(APPEND HSDP_MODULE_CALLS "  ${fn}();\n")
endforeach()
foreach(entry ${_hsdp_missing})
  # "name|reason" (a reason may not contain ";", the list separator)
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 name)
  list(GET parts 1 reason)
  string(APPEND HSDP_MODULE_CALLS "  registerUnavailableTransport(\"${name}\", \"${reason}\");\n")
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/hsdp_modules.cc.in
               ${PROJECT_BINARY_DIR}/generated/hsdp_modules.cc @ONLY)
if(HSDP_HAVE_CUDA)
  set(HSDP_BUILT_WITH_CUDA 1)
else()
  set(HSDP_BUILT_WITH_CUDA 0)
endif()
if(HSDP_HAVE_UCX)
  set(HSDP_BUILT_WITH_UCX 1)
else()
  set(HSDP_BUILT_WITH_UCX 0)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in
               ${PROJECT_BINARY_DIR}/include/hsdp/version.h @ONLY)
target_sources(hsdp PRIVATE ${PROJECT_BINARY_DIR}/generated/hsdp_modules.cc)
