#include "test/kube/kube_test_support.h"

#include "test/support/gpu_objects.h"

#include "test/support/fixture_host.h"

namespace cozy::testing {

std::filesystem::path ChartCrdDir() {
  return SourceDir() / "charts" / "gpu" / "templates" / "crds";
}
std::filesystem::path GpuNodeCrdFile() { return ChartCrdDir() / "gpunodes.yaml"; }
std::filesystem::path TestCrdDir() { return SourceDir() / "test" / "fakes" / "crds"; }
std::filesystem::path TestCrdFile(const std::string& name) { return TestCrdDir() / name; }

std::unique_ptr<fake::FakeApiServer> StartFakeApiServer(bool withCrds) {
  fake::FakeApiServerOptions options;
  if (withCrds) options.crdPaths.push_back(GpuNodeCrdFile());
  options.bookmarkInterval = std::chrono::milliseconds(100);
  auto server = std::make_unique<fake::FakeApiServer>(options);
  server->Start();
  return server;
}

std::unique_ptr<fake::FakeApiServer> StartChartApiServer() {
  fake::FakeApiServerOptions options;
  options.crdPaths = {ChartCrdDir()};
  auto server = std::make_unique<fake::FakeApiServer>(options);
  server->Start();
  return server;
}

kube::ClientOptions TestClientOptions(kube::TimeSource& time, int maxRetries) {
  kube::ClientOptions options;
  options.time = &time;
  options.random = [] { return 0.0; };
  options.maxRetries = maxRetries;
  options.qps = 0;
  options.connectTimeout = std::chrono::seconds(2);
  options.requestTimeout = std::chrono::seconds(5);
  return options;
}

kube::ClientConfig ConfigFor(const fake::FakeApiServer& server, const std::string& token) {
  kube::ClientConfig config;
  config.server = server.url();
  config.token = token;
  return config;
}

std::vector<fake::LoggedRequest> RequestsTo(const fake::FakeApiServer& server,
                                            const std::string& method,
                                            const std::string& pathPrefix) {
  std::vector<fake::LoggedRequest> matching;
  for (const auto& request : server.Requests()) {
    if (!method.empty() && request.method != method) continue;
    if (request.path.rfind(pathPrefix, 0) != 0) continue;
    matching.push_back(request);
  }
  return matching;
}

std::vector<fake::LoggedRequest> Writes(const fake::FakeApiServer& server) {
  std::vector<fake::LoggedRequest> writes;
  for (const auto& request : server.Requests()) {
    if (request.method != "GET") writes.push_back(request);
  }
  return writes;
}

nlohmann::json NodeObject(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
          {"status", {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

void SeedOneGpuNode(fake::FakeApiServer& server, const std::string& ns, const std::string& node,
                    int units) {
  server.Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  server.Seed(ReadyNode(node));
  server.Seed(GpuNodeObject(node, units));
  server.Seed(GpuClassObject("a100"));
}

}  // namespace cozy::testing
