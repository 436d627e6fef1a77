// Internal to hsdp: the modules built into libhsdp (transports, the CUDA memory space) register
// themselves on the first call of ensureModulesRegistered(); every registry calls it before a
// lookup. The list is generated at configure time (cmake/HsdpModules.cmake).
#pragma once

namespace hsdp::modules {

void ensureRegistered();

}  // namespace hsdp::modules
