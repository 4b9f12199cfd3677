// How this machine's caches are shared, for code inside the library (device.cc reads sysfs).
#pragma once

namespace tokamax {

// Whether cpu0's last-level (L3) cache serves every online CPU: one L3 instance (a desktop
// chip, a VM), not one per die or socket. False where sysfs does not say. Read once.
bool last_level_cache_serves_all_cpus();

}  // namespace tokamax
