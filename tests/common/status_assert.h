// GoogleTest assertions on an hsdp::Status: the failure message is the Status itself.
#pragma once

#include <gtest/gtest.h>

#include "hsdp/status.h"

#define ASSERT_OK(expr)                              \
  do {                                               \
    ::hsdp::Status hsdp_s_ = (expr);                 \
    ASSERT_TRUE(hsdp_s_.ok()) << hsdp_s_.toString(); \
  } while (0)
#define EXPECT_OK(expr)                              \
  do {                                               \
    ::hsdp::Status hsdp_s_ = (expr);                 \
    EXPECT_TRUE(hsdp_s_.ok()) << hsdp_s_.toString(); \
  } while (0)
