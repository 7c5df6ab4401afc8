#include "sysfs/host_scan.h"

#include <algorithm>

namespace cozy::sysfs {

const PciFunction* HostScan::Find(const PciAddress& address) const {
  auto it =
      std::lower_bound(functions.begin(), functions.end(), address,
                       [](const PciFunction& f, const PciAddress& a) { return f.address < a; });
  if (it == functions.end() || it->address != address) {
    return nullptr;
  }
  return &*it;
}

std::vector<const PciFunction*> HostScan::Gpus() const {
  std::vector<const PciFunction*> gpus;
  for (const auto& function : functions) {
    if (function.isGpu) {
      gpus.push_back(&function);
    }
  }
  return gpus;
}

}  // namespace cozy::sysfs
