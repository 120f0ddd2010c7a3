// A stand-in for absl/log/initialize.h: the plugin initializes nothing
// (NIXL's core owns logging). Written for OrbitTE's NIXL plugin; not
// Abseil's code.
#ifndef ORBITTE_NIXL_ABSL_LOG_INITIALIZE_H
#define ORBITTE_NIXL_ABSL_LOG_INITIALIZE_H

namespace absl {
inline void InitializeLog() {}
} // namespace absl

#endif
