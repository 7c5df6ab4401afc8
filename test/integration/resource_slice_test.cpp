// The devices of the node's ResourceSlice (docs/dra.md, "The agent's ResourceSlice"), built from
// fixture hosts: one per vfio-bound GPU function, with the standard PCI attributes Kubernetes
// defines, the catalog's id and the taint only the catalog's claims tolerate (A10).
#include "agent/status/resource_slice.h"

#include <gtest/gtest.h>

#include "test/support/fixture_host.h"

namespace cozy::agent {
namespace {
using nlohmann::json;

std::vector<std::string> Names(const json& devices) {
  std::vector<std::string> names;
  for (const json& device : devices) names.push_back(device["name"]);
  return names;
}

TEST(ResourceSliceA10, EachVfioBoundGpuIsOneTaintedDeviceWithItsPciAttributes) {
  const json devices = SliceDevices(testing::FixtureHost("a100-vfio").Scan(), "node-a");
  ASSERT_EQ(Names(devices), (std::vector<std::string>{"pci-0000-3b-00-0", "pci-0000-af-00-0"}));
  const json& first = devices[0];
  const json expected = {{"resource.kubernetes.io/pciBusID", {{"string", "0000:3b:00.0"}}},
                         {"resource.kubernetes.io/pcieRoot", {{"string", "pci0000:3a"}}},
                         {"id", {{"string", "node-a/0000:3b:00.0"}}},
                         {"vendorID", {{"string", "10de"}}},
                         {"deviceID", {{"string", "20f1"}}},
                         {"model", {{"string", "GA100 [A100 PCIe 40GB]"}}},
                         {"numaNode", {{"int", 0}}},
                         {"iommuGroup", {{"int", 40}}},
                         {"iommuGroupViable", {{"bool", true}}}};
  EXPECT_EQ(first["attributes"], expected) << first.dump(1);
  EXPECT_EQ(first["taints"],
            json::parse(R"([{"key": "gpu.cozystack.io/catalog", "effect": "NoSchedule"}])"));
  EXPECT_EQ(devices[1]["attributes"]["resource.kubernetes.io/pcieRoot"]["string"], "pci0000:ae");
  EXPECT_EQ(devices[1]["attributes"]["numaNode"]["int"], 1);
}

TEST(ResourceSliceA10, FunctionsNotOnVfioAreNotOffered) {
  // A T4 on nvidia (an mdev parent) and an L40S whose VFs are NVIDIA's vendor vGPU VFs: nothing a
  // passthrough class may sell yet.
  EXPECT_EQ(SliceDevices(testing::FixtureHost("t4-mdev").Scan(), "n"), json::array());
  EXPECT_EQ(SliceDevices(testing::FixtureHost("l40s-vendor-vfio").Scan(), "n"), json::array());
  // The RTX 3090's HDMI audio function shares its group and driver but is no GPU.
  EXPECT_EQ(Names(SliceDevices(testing::FixtureHost("rtx3090-vfio").Scan(), "n")),
            std::vector<std::string>{"pci-0000-0a-00-0"});
}

TEST(ResourceSliceA10, AVfOnVfioNamesItsPhysicalFunction) {
  const json devices = SliceDevices(testing::FixtureHost("mi300x-sriov").Scan(), "n");
  ASSERT_EQ(devices.size(), 1u) << devices.dump(1);
  EXPECT_EQ(devices[0]["attributes"]["physicalFunction"]["string"], "0000:85:00.0");
  EXPECT_EQ(devices[0]["attributes"]["vendorID"]["string"], "1002");
}

TEST(ResourceSliceA10, PcieRootIsTheRootComplexOfTheRealPath) {
  EXPECT_EQ(PcieRoot("/r/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"), "pci0000:3a");
  EXPECT_EQ(PcieRoot("/sys/devices/pci10000:00/10000:00:01.0/0000:01:00.0"), std::nullopt)
      << "a VMD domain's functions sit behind no root complex of their own";
  EXPECT_EQ(PcieRoot("/sys/bus/pci/devices/0000:3b:00.0"), std::nullopt);
  EXPECT_EQ(PcieRoot(""), std::nullopt);
}

TEST(ResourceSliceA10, TheSliceIsTheNodesOwnPoolOwnedByItsNode) {
  const json slice = ResourceSliceObject("node-a", "uid-1", json::array(), 7);
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["metadata"]["name"], "node-a-gpu.cozystack.io");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  EXPECT_EQ(slice["spec"]["nodeName"], "node-a");
  EXPECT_EQ(slice["spec"]["driver"], "gpu.cozystack.io");
  EXPECT_EQ(slice["spec"]["pool"],
            json::parse(R"({"name": "node-a", "generation": 7, "resourceSliceCount": 1})"));
}

TEST(ResourceSliceA10, TheServersTaintTimeIsNotADifference) {
  const json sent =
      json::parse(R"([{"name": "d", "taints": [{"key": "k", "effect": "NoSchedule"}]}])");
  json stored = sent;
  stored[0]["taints"][0]["timeAdded"] = "2026-12-07T05:00:00Z";
  EXPECT_EQ(ComparableDevices(stored), ComparableDevices(sent));
  stored[0]["taints"][0]["effect"] = "NoExecute";
  EXPECT_NE(ComparableDevices(stored), ComparableDevices(sent));
}

}  // namespace
}  // namespace cozy::agent
