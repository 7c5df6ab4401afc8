#include "test/fakes/fake_kubelet.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "podresources/api.grpc.pb.h"

namespace cozy::fakes {
namespace {

using nlohmann::json;

[[noreturn]] void Fail(const std::string& message) {
  throw std::runtime_error("scenario: " + message);
}

const json& Require(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) {
    Fail(where + ": missing \"" + key + "\"");
  }
  return object.at(key);
}

std::string StringAt(const json& object, const char* key, const std::string& where) {
  const json& value = Require(object, key, where);
  if (!value.is_string()) {
    Fail(where + "." + key + ": not a string");
  }
  return value.get<std::string>();
}

const json& ArrayAt(const json& object, const char* key, const std::string& where) {
  static const json kEmpty = json::array();
  if (!object.contains(key)) {
    return kEmpty;
  }
  const json& value = object.at(key);
  if (!value.is_array()) {
    Fail(where + "." + key + ": not an array");
  }
  return value;
}

ScenarioDevices ParseDevices(const json& entry, const std::string& where) {
  ScenarioDevices devices;
  devices.resource = StringAt(entry, "resource", where);
  for (const json& id : ArrayAt(entry, "ids", where)) {
    if (!id.is_string()) {
      Fail(where + ".ids: not all strings");
    }
    devices.ids.push_back(id.get<std::string>());
  }
  if (entry.contains("numaNodes")) {
    std::vector<int64_t> nodes;
    for (const json& node : ArrayAt(entry, "numaNodes", where)) {
      if (!node.is_number_integer()) {
        Fail(where + ".numaNodes: not all integers");
      }
      nodes.push_back(node.get<int64_t>());
    }
    devices.numaNodes = std::move(nodes);
  }
  return devices;
}

Behaviour BehaviourAt(const json& behaviour, const char* key) {
  if (!behaviour.contains(key)) {
    return Behaviour::kOk;
  }
  const json& value = behaviour.at(key);
  const auto parsed = value.is_string() ? ParseBehaviour(value.get<std::string>()) : std::nullopt;
  if (!parsed) {
    Fail(std::string("behaviour.") + key + ": expected one of ok, hang, unimplemented, " +
         "disabled, resourceExhausted, unavailable, error");
  }
  return *parsed;
}

void FillDevices(const ScenarioDevices& devices, v1::ContainerDevices* out) {
  out->set_resource_name(devices.resource);
  for (const auto& id : devices.ids) {
    out->add_device_ids(id);
  }
  if (devices.numaNodes) {
    // mutable_topology() marks the submessage present even with no nodes.
    auto* topology = out->mutable_topology();
    for (int64_t node : *devices.numaNodes) {
      topology->add_nodes()->set_id(node);
    }
  }
}

void FillPod(const ScenarioPod& pod, v1::PodResources* out) {
  out->set_namespace_(pod.podNamespace);
  out->set_name(pod.name);
  for (const auto& container : pod.containers) {
    auto* containerOut = out->add_containers();
    containerOut->set_name(container.name);
    for (const auto& devices : container.devices) {
      FillDevices(devices, containerOut->add_devices());
    }
  }
}

}  // namespace

std::optional<Behaviour> ParseBehaviour(std::string_view text) {
  static const std::pair<std::string_view, Behaviour> kNames[] = {
      {"ok", Behaviour::kOk},
      {"hang", Behaviour::kHang},
      {"unimplemented", Behaviour::kUnimplemented},
      {"disabled", Behaviour::kDisabled},
      {"resourceExhausted", Behaviour::kResourceExhausted},
      {"unavailable", Behaviour::kUnavailable},
      {"error", Behaviour::kError},
  };
  for (const auto& [name, behaviour] : kNames) {
    if (name == text) {
      return behaviour;
    }
  }
  return std::nullopt;
}

Scenario ParseScenario(std::string_view text) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& error) {
    Fail(std::string("not JSON: ") + error.what());
  }
  if (!document.is_object()) {
    Fail("top level: not an object");
  }
  Scenario scenario;
  const json& allocatable = ArrayAt(document, "allocatable", "top level");
  for (size_t i = 0; i < allocatable.size(); ++i) {
    scenario.allocatable.push_back(
        ParseDevices(allocatable[i], "allocatable[" + std::to_string(i) + "]"));
  }
  const json& pods = ArrayAt(document, "pods", "top level");
  for (size_t i = 0; i < pods.size(); ++i) {
    const std::string where = "pods[" + std::to_string(i) + "]";
    ScenarioPod pod;
    pod.podNamespace = StringAt(pods[i], "namespace", where);
    pod.name = StringAt(pods[i], "name", where);
    const json& containers = ArrayAt(pods[i], "containers", where);
    for (size_t c = 0; c < containers.size(); ++c) {
      const std::string containerWhere = where + ".containers[" + std::to_string(c) + "]";
      ScenarioContainer container;
      container.name = StringAt(containers[c], "name", containerWhere);
      const json& devices = ArrayAt(containers[c], "devices", containerWhere);
      for (size_t d = 0; d < devices.size(); ++d) {
        container.devices.push_back(
            ParseDevices(devices[d], containerWhere + ".devices[" + std::to_string(d) + "]"));
      }
      pod.containers.push_back(std::move(container));
    }
    scenario.pods.push_back(std::move(pod));
  }
  if (document.contains("behaviour")) {
    const json& behaviour = document.at("behaviour");
    if (!behaviour.is_object()) {
      Fail("behaviour: not an object");
    }
    scenario.getAllocatableResources = BehaviourAt(behaviour, "getAllocatableResources");
    scenario.list = BehaviourAt(behaviour, "list");
    scenario.get = BehaviourAt(behaviour, "get");
    if (behaviour.contains("delayMs")) {
      if (!behaviour.at("delayMs").is_number_unsigned()) {
        Fail("behaviour.delayMs: not a non-negative integer");
      }
      scenario.delay = std::chrono::milliseconds(behaviour.at("delayMs").get<int64_t>());
    }
  }
  return scenario;
}

Scenario LoadScenario(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("scenario: cannot open " + path);
  }
  std::ostringstream content;
  content << in.rdbuf();
  try {
    return ParseScenario(content.str());
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(path + ": " + error.what());
  }
}

struct FakeKubelet::Impl final : v1::PodResourcesLister::Service {
  mutable std::mutex mutex;
  std::condition_variable changed;
  // Shared, never mutated: a call answers from the scenario it entered with, without copying
  // hundreds of pods under the lock.
  std::shared_ptr<const Scenario> scenario = std::make_shared<const Scenario>();
  CallCounts calls;
  bool stopping = false;
  std::string socketPath;
  std::unique_ptr<grpc::Server> server;

  // Waits out the delay and any hang; returns the scenario to answer from, or null when the
  // call was abandoned.
  std::shared_ptr<const Scenario> Enter(grpc::ServerContext* context, Behaviour Scenario::*method,
                                        int64_t CallCounts::*counter) {
    std::unique_lock lock(mutex);
    ++(calls.*counter);
    const auto deadline = std::chrono::steady_clock::now() + scenario->delay;
    changed.wait_until(lock, deadline, [this] { return stopping; });
    // A hang ends only when the client gives up, the server stops, or the scenario changes.
    while ((*scenario).*method == Behaviour::kHang) {
      if (stopping || context->IsCancelled()) {
        return nullptr;
      }
      changed.wait_for(lock, std::chrono::milliseconds(10));
    }
    return scenario;
  }

  static std::optional<grpc::Status> Misbehave(Behaviour behaviour, std::string_view rpc) {
    switch (behaviour) {
      case Behaviour::kOk:
      case Behaviour::kHang:
        return std::nullopt;
      case Behaviour::kUnimplemented:
        return grpc::Status(
            grpc::StatusCode::UNIMPLEMENTED,
            "unknown method " + std::string(rpc) + " for service v1.PodResourcesLister");
      case Behaviour::kDisabled:
        return grpc::Status(grpc::StatusCode::UNKNOWN,
                            "Pod Resources API " + std::string(rpc) + " disabled");
      case Behaviour::kResourceExhausted:
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "rejected by rate limit");
      case Behaviour::kUnavailable:
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake kubelet: unavailable");
      case Behaviour::kError:
        return grpc::Status(grpc::StatusCode::UNKNOWN, "fake kubelet: internal error");
    }
    return std::nullopt;
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext* context,
                                       const v1::AllocatableResourcesRequest* /*request*/,
                                       v1::AllocatableResourcesResponse* response) override {
    const auto current =
        Enter(context, &Scenario::getAllocatableResources, &CallCounts::getAllocatableResources);
    if (!current) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "fake kubelet: call abandoned");
    }
    if (auto status = Misbehave(current->getAllocatableResources, "GetAllocatableResources")) {
      return *status;
    }
    for (const auto& devices : current->allocatable) {
      FillDevices(devices, response->add_devices());
    }
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext* context, const v1::ListPodResourcesRequest* /*request*/,
                    v1::ListPodResourcesResponse* response) override {
    const auto current = Enter(context, &Scenario::list, &CallCounts::list);
    if (!current) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "fake kubelet: call abandoned");
    }
    if (auto status = Misbehave(current->list, "List")) {
      return *status;
    }
    for (const auto& pod : current->pods) {
      FillPod(pod, response->add_pod_resources());
    }
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override {
    const auto current = Enter(context, &Scenario::get, &CallCounts::get);
    if (!current) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "fake kubelet: call abandoned");
    }
    if (auto status = Misbehave(current->get, "Get")) {
      return *status;
    }
    for (const auto& pod : current->pods) {
      if (pod.name == request->pod_name() && pod.podNamespace == request->pod_namespace()) {
        FillPod(pod, response->mutable_pod_resources());
        return grpc::Status::OK;
      }
    }
    // kubelet answers a plain Go error for a pod it does not know.
    return grpc::Status(grpc::StatusCode::UNKNOWN,
                        "pod " + request->pod_name() + " not found in " + request->pod_namespace());
  }
};

FakeKubelet::FakeKubelet() : impl_(std::make_unique<Impl>()) {}

FakeKubelet::~FakeKubelet() { Stop(); }

void FakeKubelet::Start(const std::string& socketPath, Scenario scenario) {
  Stop();
  {
    std::lock_guard lock(impl_->mutex);
    impl_->scenario = std::make_shared<const Scenario>(std::move(scenario));
    impl_->stopping = false;
    impl_->socketPath = socketPath;
  }
  grpc::ServerBuilder builder;
  int selectedPort = 0;
  builder.AddListeningPort("unix:" + socketPath, grpc::InsecureServerCredentials(), &selectedPort);
  builder.RegisterService(impl_.get());
  // As kubelet: answers may be large (many pods).
  builder.SetMaxSendMessageSize(64 * 1024 * 1024);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || selectedPort == 0) {
    impl_->server.reset();
    throw std::runtime_error("fake kubelet: cannot listen on unix:" + socketPath);
  }
}

void FakeKubelet::Stop() {
  if (!impl_->server) {
    return;
  }
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->server->Wait();
  impl_->server.reset();
  ::unlink(impl_->socketPath.c_str());
}

void FakeKubelet::SetScenario(Scenario scenario) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->scenario = std::make_shared<const Scenario>(std::move(scenario));
  }
  impl_->changed.notify_all();
}

CallCounts FakeKubelet::Calls() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->calls;
}

std::string FakeKubelet::Endpoint() const {
  std::lock_guard lock(impl_->mutex);
  return "unix://" + impl_->socketPath;
}

RefusingSocket::RefusingSocket(const std::string& path) : path_(path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    throw std::runtime_error("refusing socket: path too long: " + path);
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd_ < 0) {
    throw std::runtime_error("refusing socket: socket(): " + std::string(std::strerror(errno)));
  }
  ::unlink(path.c_str());
  // Bound but never listening: the file exists, connect() gets ECONNREFUSED.
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd_);
    throw std::runtime_error("refusing socket: bind " + path + ": " + reason);
  }
}

RefusingSocket::~RefusingSocket() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

}  // namespace cozy::fakes
