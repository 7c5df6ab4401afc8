// Name tables shared by the validator tests and the CRD tests (B4, B8), so both judge the
// same inputs.
#pragma once

#include <string>
#include <vector>

namespace cozy::api {

struct NameCase {
  std::string name;
  bool valid;
};

inline std::vector<NameCase> ClassNameCases() {
  return {
      {"a100-80g", true},
      {"l40s", true},
      {"a", true},
      {std::string(63, 'a'), true},
      {"total", false},
      {"A100", false},
      {std::string(64, 'a'), false},
      {"-a100", false},
      {"a100-", false},
      {"a100.80g", false},
      {"a100_80g", false},
      {"", false},
      {"totals", true},
  };
}

inline std::vector<NameCase> ResourceNameCases() {
  return {
      {"nvidia.com/GA100", true},
      {"nvidia.com/GA100_A100_PCIE_80GB", true},
      {"nvidia.com/NVIDIA_A100-40C", true},
      {"amd.com/gpu", true},
      {"example/gpu", true},
      {"gpu.cozystack.io/a100", false},
      {"x.gpu.cozystack.io/a100", false},
      {"notgpu.cozystack.io/a100", true},
      {"cpu", false},
      {"kubernetes.io/gpu", false},
      {"devices.kubernetes.io/gpu", false},
      {"requests.nvidia.com/gpu", false},
      {"nvidia.com/", false},
      {"nvidia.com/-gpu", false},
      {"Nvidia.com/gpu", false},
      {"nvidia.com/" + std::string(64, 'g'), false},
      {"nvidia.com/" + std::string(63, 'g'), true},
      {"nvidia.com/a/b", false},
  };
}

}  // namespace cozy::api
