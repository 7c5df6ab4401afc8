// The model's single-rule readers (controller/model/readers.h), one table each. Each test
// quotes the design-note sentence it implements and names its catalog ID.
#include <gtest/gtest.h>

#include "api/quantity.h"
#include "api/validation.h"
#include "controller/model/model.h"
#include "controller/model/readers.h"
#include "test/controller/model_fixtures.h"

namespace cozy::model {
namespace {

using namespace cozy::model::testing;

// C3: "GPU budgets cap the whole subtree of the tenant that declares them, walked over the
// namespace ancestry"
TEST(TenantTreeC3, AncestorsFromTenantLabelsNearestFirst) {
  const TenantTree tree({MakeTenant("tenant-root", {}), MakeTenant("tenant-a", {"tenant-root"}),
                         MakeTenant("tenant-a-b", {"tenant-root", "tenant-a"}),
                         MakeTenant("tenant-a-b-c", {"tenant-a", "tenant-a-b", "tenant-root"}),
                         Namespace{"kube-system", {}}});
  struct Case {
    std::string ns;
    std::vector<std::string_view> chain;
  };
  const std::vector<Case> cases = {
      {"tenant-root", {"tenant-root"}},
      {"tenant-a", {"tenant-a", "tenant-root"}},
      {"tenant-a-b", {"tenant-a-b", "tenant-a", "tenant-root"}},
      {"tenant-a-b-c", {"tenant-a-b-c", "tenant-a-b", "tenant-a", "tenant-root"}},
      {"unknown", {"unknown"}},
  };
  std::vector<std::string_view> chain = {"left over from an earlier call"};
  for (const Case& c : cases) {
    tree.BudgetChain(c.ns, chain);
    EXPECT_EQ(chain, c.chain) << c.ns;
  }
  EXPECT_TRUE(tree.IsTenant("tenant-root")) << "named by a label, carries none";
  EXPECT_TRUE(tree.IsTenant("tenant-a-b"));
  EXPECT_FALSE(tree.IsTenant("kube-system"));
}

Container MakeContainer(std::optional<int> gpus, bool sidecar = false, bool limitOnly = false) {
  Container container;
  if (gpus) {
    (limitOnly ? container.limits : container.requests)[kA100] = std::to_string(*gpus);
  }
  container.restartAlways = sidecar;
  return container;
}

struct PodCase {
  const char* what;
  std::vector<Container> init;
  std::vector<Container> app;
  std::optional<int> overhead;
  int64_t expected;
};

// C5: "Pod usage follows the scheduler's arithmetic, sidecars included, so the binder never
// books a unit a raw-name pod holds."
TEST(PodResourceRequestsC5, SchedulerArithmetic) {
  const std::vector<PodCase> cases = {
      {"one app container", {}, {MakeContainer(1)}, {}, 1},
      {"app containers add up", {}, {MakeContainer(1), MakeContainer(2)}, {}, 3},
      {"init larger than apps", {MakeContainer(2)}, {MakeContainer(1)}, {}, 2},
      {"init smaller than apps", {MakeContainer(1)}, {MakeContainer(3)}, {}, 3},
      {"catalog: sidecar 1 before init 2, app 1",
       {MakeContainer(1, true), MakeContainer(2)},
       {MakeContainer(1)},
       {},
       3},
      {"sidecar after init: init alone, then sidecar with apps",
       {MakeContainer(2), MakeContainer(1, true)},
       {MakeContainer(1)},
       {},
       2},
      {"two sidecars run with the apps",
       {MakeContainer(1, true), MakeContainer(1, true)},
       {MakeContainer(1)},
       {},
       3},
      {"request defaults to limit", {}, {MakeContainer(2, false, true)}, {}, 2},
      {"overhead is added", {}, {MakeContainer(1)}, 1, 2},
      {"no GPU", {}, {MakeContainer(std::nullopt)}, {}, 0},
  };
  for (const PodCase& c : cases) {
    Pod pod;
    pod.initContainers = c.init;
    pod.containers = c.app;
    if (c.overhead) {
      pod.overhead[kA100] = std::to_string(*c.overhead);
    }
    const auto requests = PodResourceRequests(pod, {kA100});
    const int64_t got = requests.contains(kA100) ? requests.at(kA100) : 0;
    EXPECT_EQ(got, c.expected) << c.what;
  }
}

// C2, C18: a request that is not a quantity, or one past what any node has, is never skipped: the
// pod holds everything it could (api::kMaxUnits), and the problem names the pod and the field.
TEST(PodResourceRequestsC2C18, UnreadableOrHugeRequestHoldsEverythingItCouldAndIsNamed) {
  for (const std::string text : {"one", "10E", "2Ti", "9223372036854775807"}) {
    Pod pod = MakePod("tenant-a", "p", "n1", kA100, 1);
    pod.containers[0].requests[kA100] = text;
    pod.initContainers.push_back(pod.containers[0]);
    pod.overhead[kA100] = text;
    std::vector<InputProblem> problems;
    const auto requests = PodResourceRequests(pod, {kA100}, &problems);
    EXPECT_EQ(requests.at(kA100), api::kMaxUnits) << text;
    ASSERT_EQ(problems.size(), 3u) << text;
    EXPECT_EQ(problems[0].kind, "Pod");
    EXPECT_EQ(problems[0].namespaceName, "tenant-a");
    EXPECT_EQ(problems[0].name, "p");
    EXPECT_EQ(problems[0].field, "spec.containers[0].resources.requests[\"nvidia.com/GA100\"]");
    EXPECT_NE(problems[0].problem.find(text), std::string::npos) << problems[0].problem;
    // Without a list to fill, the same reading.
    EXPECT_EQ(PodResourceRequests(pod, {kA100}), requests);
  }
  // In range: as it says, and no problem.
  std::vector<InputProblem> problems;
  Pod pod = MakePod("tenant-a", "p", "n1", kA100, 1);
  pod.containers[0].requests[kA100] = "1Ti";
  EXPECT_EQ(PodResourceRequests(pod, {kA100}, &problems).at(kA100), api::kMaxUnits);
  EXPECT_TRUE(problems.empty());
}

TEST(PodHoldsDevicesA7, FinalPhasesHoldNothing) {
  for (const auto& [phase, holds] : std::vector<std::pair<std::string, bool>>{{"Running", true},
                                                                              {"Pending", true},
                                                                              {"Unknown", true},
                                                                              {"Succeeded", false},
                                                                              {"Failed", false}}) {
    Pod pod;
    pod.phase = phase;
    EXPECT_EQ(PodHoldsDevices(pod), holds) << phase;
  }
}

// docs/controller.md, "Who wakes for a change": which pod changes can wake the binder. Only a pod
// that asks for an extended resource can count (device plugins' and KubeVirt's names all have a
// domain), and only when the model reads something different in it.
TEST(PodChangeMatters, OnlyPodsAskingForExtendedResourcesAndOnlyRealChanges) {
  const Pod web = [] {
    Pod pod = MakePod("tenant-a", "web", "n1", "cpu", 2);
    pod.containers[0].requests["memory"] = "1Gi";
    return pod;
  }();
  const Pod gpu = MakePod("tenant-a", "raw", "n1", kA100, 1);
  const Pod launcher = MakePod("tenant-a", "virt-launcher-vm1", "n1", "devices.kubevirt.io/kvm", 1);
  Pod sidecar = web;
  sidecar.initContainers.push_back(gpu.containers[0]);
  Pod overhead = web;
  overhead.overhead["example.com/foo"] = "1";
  Pod gpuDone = gpu;
  gpuDone.phase = "Succeeded";
  Pod webMoved = web;
  webMoved.phase = "Succeeded";
  struct Case {
    const char* what;
    const Pod* before;
    const Pod* after;
    bool matters;
  };
  const std::vector<Case> cases = {
      {"a cpu and memory pod starts", nullptr, &web, false},
      {"a cpu and memory pod ends", &web, &webMoved, false},
      {"a cpu and memory pod goes", &web, nullptr, false},
      {"a GPU pod starts", nullptr, &gpu, true},
      {"a GPU pod ends", &gpu, &gpuDone, true},
      {"a GPU pod goes", &gpu, nullptr, true},
      {"a GPU pod's status heartbeat (nothing the model reads)", &gpu, &gpu, false},
      {"a launcher asking for KubeVirt's kvm only", nullptr, &launcher, true},
      {"an init container asking for a GPU", nullptr, &sidecar, true},
      {"an extended resource in the overhead", nullptr, &overhead, true},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PodChangeMatters(c.before, c.after), c.matters) << c.what;
  }
  EXPECT_FALSE(PodAsksForExtendedResources(web));
  EXPECT_TRUE(PodAsksForExtendedResources(gpu));
}

// C11: "A pod now counts as a VMI's launcher only when that VMI lists the pod's UID in
// status.activePods; any other pod's GPUs count as raw-name usage."
TEST(LauncherIndexC11, OnlyActivePodsProveALauncher) {
  const SharedVector<VirtualMachineInstance> vmis = {MakeVmi("tenant-a", "vm1", {"launcher-uid"})};
  const LauncherIndex index(vmis);
  struct Case {
    const char* what;
    std::string ns;
    std::string uid;
    bool launcher;
  };
  const std::vector<Case> cases = {
      {"listed in activePods", "tenant-a", "launcher-uid", true},
      {"named like the launcher, owned by the VMI, not listed", "tenant-a", "impostor-uid", false},
      {"same UID, other namespace", "tenant-b", "launcher-uid", false},
      {"no UID", "tenant-a", "", false},
  };
  for (const Case& c : cases) {
    Pod pod;
    pod.namespaceName = c.ns;
    pod.name = "virt-launcher-vm1-abcde";
    pod.uid = c.uid;
    EXPECT_EQ(index.LauncherOf(pod) != nullptr, c.launcher) << c.what;
  }
}

struct EligibilityCase {
  const char* what;
  bool unschedulable;
  bool ready;
  std::vector<Taint> taints;
  std::vector<Toleration> tolerations;
  bool eligible;
  bool cordoned;
};

// C7: "A node takes binds only when it is schedulable, Ready and carries no NoSchedule or
// NoExecute taint the pod does not tolerate"; C8: "the unschedulable, not-ready and unreachable
// taints are left to the first two checks, and a taint never counts as a cordon"; C9: "Gt and
// Lt tolerations do not count".
TEST(NodeEligibilityC7C8C9, Table) {
  const std::vector<EligibilityCase> cases = {
      {"C7 plain node", false, true, {}, {}, true, false},
      {"C7 cordoned", true, true, {}, {}, false, true},
      {"C7 NotReady", false, false, {}, {}, false, false},
      {"C7 untolerated NoExecute",
       false,
       true,
       {{"maintenance", "", "NoExecute"}},
       {},
       false,
       false},
      {"C7 PreferNoSchedule binds",
       false,
       true,
       {{"gpu", "busy", "PreferNoSchedule"}},
       {},
       true,
       false},
      {"C7 tolerated NoSchedule (Equal)",
       false,
       true,
       {{"gpu", "a100", "NoSchedule"}},
       {{"gpu", "Equal", "a100", "NoSchedule"}},
       true,
       false},
      {"C7 toleration with another value",
       false,
       true,
       {{"gpu", "a100", "NoSchedule"}},
       {{"gpu", "Equal", "l40", "NoSchedule"}},
       false,
       false},
      {"C7 Exists without key tolerates all",
       false,
       true,
       {{"gpu", "a100", "NoExecute"}},
       {{"", "Exists", "", ""}},
       true,
       false},
      {"C7 toleration for another effect",
       false,
       true,
       {{"gpu", "a100", "NoExecute"}},
       {{"gpu", "Exists", "", "NoSchedule"}},
       false,
       false},
      {"C8 stale unreachable taint on a Ready node",
       false,
       true,
       {{"node.kubernetes.io/unreachable", "", "NoExecute"}},
       {},
       true,
       false},
      {"C8 stale not-ready taint",
       false,
       true,
       {{"node.kubernetes.io/not-ready", "", "NoSchedule"}},
       {},
       true,
       false},
      {"C8 unschedulable taint is no cordon",
       false,
       true,
       {{"node.kubernetes.io/unschedulable", "", "NoSchedule"}},
       {},
       true,
       false},
      {"C8 custom NoSchedule: ineligible, not cordoned",
       false,
       true,
       {{"dedicated", "ml", "NoSchedule"}},
       {},
       false,
       false},
      {"C9 Gt toleration tolerates nothing",
       false,
       true,
       {{"gpu", "5", "NoSchedule"}},
       {{"gpu", "Gt", "1", "NoSchedule"}},
       false,
       false},
      {"C9 Lt toleration tolerates nothing",
       false,
       true,
       {{"gpu", "5", "NoSchedule"}},
       {{"gpu", "Lt", "9", ""}},
       false,
       false},
  };
  for (const EligibilityCase& c : cases) {
    Node node = MakeNode("n1");
    node.unschedulable = c.unschedulable;
    node.ready = c.ready;
    node.taints = c.taints;
    const NodeEligibility result = CheckNodeEligibility(node, c.tolerations);
    EXPECT_EQ(result.eligible, c.eligible) << c.what;
    EXPECT_EQ(result.cordoned, c.cordoned) << c.what;
    EXPECT_EQ(result.reasons.empty(), c.eligible) << c.what << ": a refusal says why";
  }
}

// C16: "The NVIDIA and mediated entries of the KubeVirt permittedHostDevices table are GPU
// resource names besides the hoster's gpu.resourceNames list, whether the hoster sets one or
// not. ... A PCI entry of another vendor, such as a ConnectX VF, stays out."
TEST(EffectiveGpuResourceNamesC16, TableEntriesJoinTheHostersList) {
  const PermittedHostDevices table{{{"10DE:20B5", "nvidia.com/X"}, {"15b3:101e", "mellanox.com/Z"}},
                                   {{"NVIDIA A2-4Q", "nvidia.com/Y"}}};
  struct Case {
    const char* what;
    std::vector<std::string> hosterList;
    std::vector<std::string> gpuNodeNames;
    std::set<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"catalog: no hoster list, nothing else", {}, {}, {"nvidia.com/X", "nvidia.com/Y"}},
      {"hoster list joins", {"amd.com/gpu"}, {}, {"amd.com/gpu", "nvidia.com/X", "nvidia.com/Y"}},
      {"GPUNode names join",
       {},
       {"nvidia.com/gpu"},
       {"nvidia.com/X", "nvidia.com/Y", "nvidia.com/gpu"}},
  };
  for (const Case& c : cases) {
    api::GpuNodeInventory gpuNode;
    gpuNode.resourceNames = c.gpuNodeNames;
    EXPECT_EQ(EffectiveGpuResourceNames(Settings{c.hosterList}, {gpuNode}, table, {}), c.expected)
        << c.what;
  }
}

// B11: one node's agent reporting resourceNames [cpu, memory, ...] (an older CRD let it through)
// adds nothing to the GPU names the raw-name policies refuse pods and VMs by; the model names
// each such entry, and the node's real GPU name still joins.
TEST(EffectiveGpuResourceNamesB11, AGpuNodesNamesThatAreNoExtendedResourceStayOut) {
  api::GpuNodeInventory gpuNode;
  gpuNode.nodeName = "n2";
  gpuNode.resourceNames = {
      "cpu",  "memory",          "hugepages-1Gi",           "ephemeral-storage",
      "pods", "kubernetes.io/x", "requests.nvidia.com/gpu", "nvidia.com/GA100"};
  EXPECT_EQ(EffectiveGpuResourceNames(Settings{}, {gpuNode}, {}, {}),
            (std::set<std::string>{"nvidia.com/GA100"}));
  Snapshot snapshot;
  snapshot.nodes = {MakeNode("n2")};
  snapshot.gpuNodes = {gpuNode};
  const Model model(snapshot);
  ASSERT_EQ(model.Problems().size(), 7u);
  EXPECT_EQ(model.Problems()[0].Describe().rfind("GPUNode n2: status.resourceNames[0]: \"cpu\"", 0),
            0u)
      << model.Problems()[0].Describe();
  EXPECT_EQ(model.View().gpuResourceNames, (std::set<std::string>{"nvidia.com/GA100"}));
}

// F18: the tenant tree and the policies' tenant label must agree; a namespace of the tree
// without the label (made before the chart's policy refused such a one) is named, and only it.
TEST(TenantNamespaceF18, ANamespaceOfTheTenantTreeWithoutTheTenantNamespaceLabelIsNamed) {
  Snapshot snapshot;
  Namespace unlabelled = MakeTenant("tenant-b", {"tenant-root"});
  unlabelled.labels.erase(std::string(api::kTenantNamespaceLabel));
  snapshot.namespaces = {MakeTenant("tenant-a", {"tenant-root"}), unlabelled,
                         Namespace{"default", {}}, Namespace{"plain", {{"team", "x"}}}};
  const Model model(snapshot);
  ASSERT_EQ(model.Problems().size(), 1u);
  EXPECT_EQ(model.Problems()[0].kind, "Namespace");
  EXPECT_EQ(model.Problems()[0].name, "tenant-b");
  EXPECT_NE(model.Problems()[0].problem.find(std::string(api::kTenantNamespaceLabel)),
            std::string::npos);
}

// C16: a class's resource name is a GPU name too, even before any node reports it,
// so a pod requesting it directly is raw-name usage and the policies see it.
TEST(EffectiveGpuResourceNamesC16, ClassResourceNamesJoin) {
  api::GpuClass gpuClass;
  gpuClass.spec.source.devicePlugin.resourceName = "nvidia.com/GA100";
  EXPECT_EQ(EffectiveGpuResourceNames(Settings{{"amd.com/gpu"}}, {}, {}, {gpuClass}),
            (std::set<std::string>{"amd.com/gpu", "nvidia.com/GA100"}));
}

// C17: "Whether a class's resource name is in the table at all is still checked against every
// PCI and mediated entry."
TEST(IsPermittedHostDeviceC17, EveryEntryCounts) {
  const PermittedHostDevices table{{{"15b3:101e", "mellanox.com/Z"}}, {{"x", "nvidia.com/Y"}}};
  EXPECT_TRUE(IsPermittedHostDevice(table, "mellanox.com/Z")) << "in the table, yet no GPU name";
  EXPECT_TRUE(IsPermittedHostDevice(table, "nvidia.com/Y"));
  EXPECT_FALSE(IsPermittedHostDevice(table, "nvidia.com/other"));
}

// C10: "Template device names are derived from the VMI and shortened with a hash when the VMI
// name leaves no room, so they stay valid subdomains."
TEST(TemplateDeviceNameC10, DerivedStableDistinctValid) {
  EXPECT_EQ(TemplateDeviceName("vm1", "gpu0"), "vm1-gpu0");
  // VMI names are valid subdomains: 253 characters need dots.
  const std::string longest = std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                              std::string(63, 'c') + "." + std::string(61, 'd');
  // The cut after 236 characters lands on the '.' before the f label.
  const std::string dotted = std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                             std::string(63, 'c') + "." + std::string(43, 'e') + "." +
                             std::string(17, 'f');
  // Short, but its one label leaves no room for "-gpu0".
  const std::string longLabel(60, 'x');
  for (const std::string& vmi : {longest, dotted, longLabel}) {
    ASSERT_TRUE(api::CheckDnsSubdomain(vmi).empty()) << "test input: " << vmi;
    const std::string first = TemplateDeviceName(vmi, "gpu0");
    const std::string second = TemplateDeviceName(vmi, "gpu1");
    EXPECT_NE(first, second) << "two templates of one VMI";
    EXPECT_EQ(first, TemplateDeviceName(vmi, "gpu0")) << "stable";
    EXPECT_TRUE(api::CheckDnsSubdomain(first).empty()) << api::CheckDnsSubdomain(first);
    EXPECT_TRUE(api::CheckDnsSubdomain(second).empty()) << api::CheckDnsSubdomain(second);
    EXPECT_EQ(first.substr(0, 40), vmi.substr(0, 40)) << "derived from the VMI name";
  }
  EXPECT_NE(TemplateDeviceName(longest + "-a", "b"), TemplateDeviceName(longest, "a-b"))
      << "the hash keeps the two names apart";
}

// B9: "it defaults to 1 for vgpu classes and to no limit for passthrough, which a structural
// default cannot express, so readers resolve it through the shared model"
TEST(ResolveMaxCountB9, PerMode) {
  struct Case {
    api::GpuMode mode;
    std::optional<int64_t> declared;
    std::optional<int64_t> expected;
  };
  const std::vector<Case> cases = {
      {api::GpuMode::kVgpu, std::nullopt, 1},
      {api::GpuMode::kPassthrough, std::nullopt, std::nullopt},
      {api::GpuMode::kVgpu, 3, 3},
      {api::GpuMode::kPassthrough, 3, 3},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ResolveMaxCount(MakeClass("c", kA100, c.mode, c.declared).spec), c.expected);
  }
}

}  // namespace
}  // namespace cozy::model
