# Optional dependencies (UCX, CUDA): a switch HSDP_WITH_<X>=AUTO|ON|OFF, in any case. AUTO builds
# the feature when what it needs is found, ON requires it, OFF does not look.
#
# hsdp_optional_mode(<switch> <out>): the switch's value, upper-cased, into <out>; any other value
# is a fatal error naming it.
function(hsdp_optional_mode switch out)
  string(TOUPPER "${${switch}}" mode)
  if(NOT mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${switch}='${${switch}}' is not one of AUTO, ON, OFF")
  endif()
  set(${out} ${mode} PARENT_SCOPE)
endfunction()

# hsdp_optional_report(<switch> <mode> <found> <found-note> <missing-error> <missing-note>): after
# the search, a status line (the note when found, "<switch>=OFF" when off, the missing note under
# AUTO) or, under ON with nothing found, the fatal error "<switch>=ON but <missing-error>".
function(hsdp_optional_report switch mode found found_note missing_error missing_note)
  if(mode STREQUAL "OFF")
    message(STATUS "hsdp: ${switch}=OFF")
  elseif(found)
    message(STATUS "hsdp: ${found_note}")
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "${switch}=ON but ${missing_error}")
  else()
    message(STATUS "hsdp: ${missing_note}")
  endif()
endfunction()
