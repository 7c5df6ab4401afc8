// Pod phases from a file (`scan --pod-phases`): a plain map or kubectl's PodList.
#include "agent/status/pod_phases.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace cozy::agent {
namespace {

TEST(ParsePodPhases, PlainMap) {
  EXPECT_EQ(ParsePodPhases(R"({"ns/a": "Running", "ns/b": "Succeeded"})"),
            (PodPhases{{"ns/a", "Running"}, {"ns/b", "Succeeded"}}));
}

TEST(ParsePodPhases, KubectlPodList) {
  const PodPhases phases = ParsePodPhases(R"({
    "apiVersion": "v1", "kind": "List",
    "items": [
      {"metadata": {"name": "a", "namespace": "ns"}, "status": {"phase": "Failed"}},
      {"metadata": {"name": "b", "namespace": "ns"}, "status": {}}
    ]})");
  // A pod without a phase is left out: unknown pods count as active.
  EXPECT_EQ(phases, (PodPhases{{"ns/a", "Failed"}}));
}

TEST(ParsePodPhases, ErrorsNameTheKey) {
  auto message = [](const char* json) {
    try {
      ParsePodPhases(json);
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[").find("not JSON"), std::string::npos);
  EXPECT_NE(message(R"({"a": "Running"})").find("\"a\": expected \"namespace/name\""),
            std::string::npos);
  EXPECT_NE(message(R"({"kind": "List", "items": [{"metadata": {"name": "a"}}]})")
                .find("items[0].metadata.namespace"),
            std::string::npos);
}

}  // namespace
}  // namespace cozy::agent
