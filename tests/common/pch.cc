// The source of hsdp_test_pch, the target whose precompiled header the tests reuse
// (cmake/HsdpPch.cmake); it compiles nothing of its own.
