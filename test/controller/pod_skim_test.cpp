// docs/controller.md, "Who wakes for a change": the pods watch skims the pods the controller does
// not keep. Skimming a pod's event (kube::SkimEvent with model::PodKeyIsExtendedResource, no JSON
// document built) must say "not wanted" for exactly the pods the cache's keep predicate drops
// (model::PodAsksForExtendedResources of the decoded pod): on random pods with extended and plain
// resources in every place a pod can carry them, read or not.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "kube/json_stream.h"
#include "test/controller/model_fixtures.h"

namespace cozy::controller {
namespace {

using nlohmann::json;

void CheckSeed(uint32_t seed) {
  std::mt19937 random(seed);
  const auto pick = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  const std::vector<std::string> names = {"cpu",
                                          "memory",
                                          "ephemeral-storage",
                                          "hugepages-2Mi",
                                          "nvidia.com/GA100",
                                          "devices.kubevirt.io/kvm",
                                          "example.com/foo"};
  const auto resources = [&] {
    json list = json::object();
    for (int i = pick(0, 2); i > 0; --i) list[names[static_cast<size_t>(pick(0, 6))]] = "1";
    return list;
  };
  const auto containers = [&](int most) {
    json list = json::array();
    for (int i = pick(0, most); i > 0; --i) {
      json container = {{"name", "c" + std::to_string(i)}, {"image", "registry.example.com/a/b"}};
      if (pick(0, 3) > 0) {
        json r = json::object();
        if (pick(0, 1)) r["requests"] = resources();
        if (pick(0, 1)) r["limits"] = resources();
        container["resources"] = r;
      }
      list.push_back(container);
    }
    return list;
  };
  int skimmed = 0, whole = 0;
  for (int round = 0; round < 2000; ++round) {
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", "p" + std::to_string(round)},
                  {"resourceVersion", std::to_string(1000 + round)},
                  {"uid", "u" + std::to_string(round)},
                  // Keys with a domain where the model reads none.
                  {"labels", {{"app.kubernetes.io/name", "x"}}},
                  {"annotations", {{"example.com/gpu", "1"}}}}},
                {"spec", {{"nodeName", "n1"}, {"containers", containers(3)}}},
                {"status", {{"phase", pick(0, 1) ? "Running" : "Pending"}}}};
    if (pick(0, 1)) pod["metadata"]["namespace"] = "tenant-" + std::to_string(pick(0, 3));
    if (pick(0, 2) == 0) pod["spec"]["initContainers"] = containers(2);
    if (pick(0, 3) == 0) pod["spec"]["overhead"] = resources();
    // Where a pod carries resources the model does not read: not wanted either way.
    if (pick(0, 3) == 0) pod["spec"]["ephemeralContainers"] = containers(1);
    if (pick(0, 3) == 0) pod["spec"]["resources"] = {{"requests", resources()}};
    if (pick(0, 3) == 0) {
      pod["status"]["containerStatuses"] = {
          {{"name", "c1"}, {"resources", {{"limits", resources()}}}}};
    }
    const std::string type =
        std::vector<std::string>{"ADDED", "MODIFIED", "DELETED"}[static_cast<size_t>(pick(0, 2))];
    const std::string text = json{{"type", type}, {"object", pod}}.dump();
    const bool kept = model::PodAsksForExtendedResources(PodFromJson(pod));
    const auto stub = kube::SkimEvent(text, model::PodKeyIsExtendedResource);
    ASSERT_EQ(stub.has_value(), !kept) << text;
    if (!stub) {
      ++whole;
      continue;
    }
    ++skimmed;
    EXPECT_EQ(stub->type, type);
    json metadata = {{"name", pod["metadata"]["name"]},
                     {"resourceVersion", pod["metadata"]["resourceVersion"]}};
    if (pod["metadata"].contains("namespace")) metadata["namespace"] = pod["metadata"]["namespace"];
    EXPECT_EQ(stub->stub, (json{{"metadata", metadata}})) << text;
  }
  // Both sides drawn often enough to mean something.
  EXPECT_GT(skimmed, 200);
  EXPECT_GT(whole, 200);
}

TEST(PodSkim, SkimsExactlyThePodsTheCacheDoesNotKeep) {
  for (const uint32_t seed : model::testing::PropertySeeds(26)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (COZY_PROPERTY_SEED replays it)");
    CheckSeed(seed);
    if (HasFailure()) return;
  }
}

// C11: the VMI a pod claims is its controller owner reference of KubeVirt's kind, nothing else;
// the usage records read that VMI by name for the proof (C12).
TEST(PodClaimedVmiC11, OnlyAControllerOwnerReferenceOfKubeVirtNamesIt) {
  const auto claimed = [](const json& owners) {
    return PodFromJson({{"metadata", {{"name", "p"}, {"ownerReferences", owners}}}}).claimedVmi;
  };
  const json vmi = {{"apiVersion", "kubevirt.io/v1"},
                    {"kind", "VirtualMachineInstance"},
                    {"name", "vm1"},
                    {"uid", "u"},
                    {"controller", true}};
  EXPECT_EQ(claimed(json::array({vmi})), "vm1");
  json notController = vmi;
  notController["controller"] = false;
  EXPECT_EQ(claimed(json::array({notController})), "");
  json otherGroup = vmi;
  otherGroup["apiVersion"] = "example.com/v1";
  EXPECT_EQ(claimed(json::array({otherGroup})), "");
  json replicaSet = vmi;
  replicaSet["kind"] = "ReplicaSet";
  replicaSet["apiVersion"] = "apps/v1";
  EXPECT_EQ(claimed(json::array({replicaSet, vmi})), "vm1");
  EXPECT_EQ(claimed(json::array()), "");
}

}  // namespace
}  // namespace cozy::controller
