// device_class NAME PCI_VENDOR_SELECTOR: the DeviceClass gpu-controller's reconciler keeps for a
// dra GPUClass of that name and selector (DraDeviceClass), as JSON, for the real-cluster test that
// has kube-apiserver compile its CEL and kube-scheduler allocate through it
// (test/realcluster/dra_slices_test.sh). Exit status 2 on bad arguments.
#include <iostream>
#include <nlohmann/json.hpp>

#include "api/validation.h"
#include "controller/reconciler/reconcilers.h"

int main(int argc, char** argv) {
  if (argc != 3 || !cozy::api::CheckPciVendorSelector(argv[2]).empty()) {
    std::cerr << "usage: device_class NAME VVVV:DDDD\n";
    return 2;
  }
  cozy::api::GpuClass gpuClass;
  gpuClass.metadata.name = argv[1];
  gpuClass.spec.source.dra = cozy::api::DraSource{argv[2]};
  std::cout << cozy::controller::DraDeviceClass(gpuClass).dump(2) << "\n";
  return 0;
}
