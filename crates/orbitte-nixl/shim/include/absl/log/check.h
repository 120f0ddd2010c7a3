// A stand-in for absl/log/check.h: CHECK aborts with a message when its
// condition is false; DCHECK evaluates nothing. Written for OrbitTE's
// NIXL plugin; not Abseil's code.
#ifndef ORBITTE_NIXL_ABSL_LOG_CHECK_H
#define ORBITTE_NIXL_ABSL_LOG_CHECK_H

#include "absl/log/log.h"

#define CHECK(condition)                                                       \
    while (!(condition))                                                       \
    ::orbitte_nixl_log::Line(::orbitte_nixl_log::Severity::FATAL, true)        \
        << "check failed: " #condition " "
#define DCHECK(condition)                                                      \
    while (false && !(condition))                                              \
    ::orbitte_nixl_log::Line(::orbitte_nixl_log::Severity::FATAL, true)

#endif
