// A fake kubelet pod-resources v1 server for tests, benchmarks and the README demo: serves a
// scenario (allocatable devices with topology, pods with their containers' devices) over real
// gRPC on a unix socket, and misbehaves on request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cozy::fakes {

// How one RPC answers.
enum class Behaviour {
  kOk,
  kHang,               // never answers: holds the call until the client gives up
  kUnimplemented,      // gRPC UNIMPLEMENTED (a kubelet without the RPC)
  kDisabled,           // UNKNOWN "Pod Resources API GetAllocatableResources disabled" (gate off)
  kResourceExhausted,  // RESOURCE_EXHAUSTED "rejected by rate limit", as kubelet's limiter
  kUnavailable,        // UNAVAILABLE
  kError,              // UNKNOWN with a message, as a plain Go error
};

std::optional<Behaviour> ParseBehaviour(std::string_view text);

struct ScenarioDevices {
  std::string resource;
  std::vector<std::string> ids;
  // Absent: no topology on the wire. Present and empty: a TopologyInfo with no nodes.
  std::optional<std::vector<int64_t>> numaNodes;
};

struct ScenarioContainer {
  std::string name;
  std::vector<ScenarioDevices> devices;
};

struct ScenarioPod {
  std::string podNamespace;
  std::string name;
  std::vector<ScenarioContainer> containers;
};

struct Scenario {
  std::vector<ScenarioDevices> allocatable;
  std::vector<ScenarioPod> pods;
  Behaviour getAllocatableResources = Behaviour::kOk;
  Behaviour list = Behaviour::kOk;
  Behaviour get = Behaviour::kOk;
  std::chrono::milliseconds delay{0};  // before every answer
};

// Parses the scenario JSON (format in docs/pod-resources.md). Throws std::runtime_error naming
// the offending key on bad input.
Scenario ParseScenario(std::string_view json);
Scenario LoadScenario(const std::string& path);

struct CallCounts {
  int64_t getAllocatableResources = 0;
  int64_t list = 0;
  int64_t get = 0;
};

class FakeKubelet {
 public:
  FakeKubelet();
  ~FakeKubelet();
  FakeKubelet(const FakeKubelet&) = delete;
  FakeKubelet& operator=(const FakeKubelet&) = delete;

  // Listens on `socketPath` (replacing a stale socket file). Throws std::runtime_error when it
  // cannot listen.
  void Start(const std::string& socketPath, Scenario scenario);
  // Stops serving; hung calls are released. The socket file is removed.
  void Stop();

  // Changes the answers of later calls (and releases hung calls if no longer hanging).
  void SetScenario(Scenario scenario);
  CallCounts Calls() const;
  std::string Endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A socket file nobody accepts on (bound, never listening): what a client meets when kubelet
// died without removing its socket. Connecting fails with ECONNREFUSED.
class RefusingSocket {
 public:
  explicit RefusingSocket(const std::string& path);  // throws std::runtime_error
  ~RefusingSocket();
  RefusingSocket(const RefusingSocket&) = delete;
  RefusingSocket& operator=(const RefusingSocket&) = delete;

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace cozy::fakes
