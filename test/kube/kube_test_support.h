// Helpers for tests against the fake API server: a server with the chart's CRDs, a client
// on injected time, and queries over the request log.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "test/fakes/fake_apiserver.h"

namespace cozy::testing {

std::filesystem::path ChartCrdDir();     // charts/gpu/templates/crds
std::filesystem::path GpuNodeCrdFile();  // charts/gpu/templates/crds/gpunodes.yaml
// test/fakes/crds: the test-only CRDs of kinds the controller reads but does not own
// (KubeVirt's VirtualMachineInstance, VirtualMachine, KubeVirt; Cozystack's WorkloadMonitor,
// Workload), one file each: TestCrdFile("kubevirt.io_virtualmachineinstances.yaml").
std::filesystem::path TestCrdDir();
std::filesystem::path TestCrdFile(const std::string& name);

// A started fake API server; with the chart's CRDs unless told otherwise.
std::unique_ptr<fake::FakeApiServer> StartFakeApiServer(bool withCrds = true);
// A started fake API server that serves every CRD of the chart (GPUClass, GPUDevice, GPUNode).
std::unique_ptr<fake::FakeApiServer> StartChartApiServer();

// Client options for tests: no rate limit, the given clock, jitter pinned to 0.
kube::ClientOptions TestClientOptions(kube::TimeSource& time, int maxRetries = 0);
kube::ClientConfig ConfigFor(const fake::FakeApiServer& server, const std::string& token = "");

// Requests of the log that match method (empty: any) and whose path starts with prefix.
std::vector<fake::LoggedRequest> RequestsTo(const fake::FakeApiServer& server,
                                            const std::string& method,
                                            const std::string& pathPrefix);
// Requests that write: POST, PUT, PATCH, DELETE.
std::vector<fake::LoggedRequest> Writes(const fake::FakeApiServer& server);

nlohmann::json NodeObject(const std::string& name);

// The smallest cluster a bind happens on: the namespace `ns`, a Ready node `node` with a GPUNode
// serving `units` of the a100 class's resource, and the GPUClass a100.
void SeedOneGpuNode(fake::FakeApiServer& server, const std::string& ns, const std::string& node,
                    int units);

}  // namespace cozy::testing
