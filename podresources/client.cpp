#include "podresources/client.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "podresources/api.grpc.pb.h"

namespace cozy::podresources {

struct Client::Channel {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub;
};

namespace {

std::optional<std::vector<int64_t>> NumaNodes(const v1::ContainerDevices& devices) {
  // Presence of the nodes, not their values, tells "node 0" from "no topology": node 0 comes
  // as a NUMANode with its ID left off the wire.
  if (!devices.has_topology() || devices.topology().nodes_size() == 0) {
    return std::nullopt;
  }
  std::vector<int64_t> nodes;
  nodes.reserve(static_cast<size_t>(devices.topology().nodes_size()));
  for (const auto& node : devices.topology().nodes()) {
    nodes.push_back(node.id());
  }
  return nodes;
}

std::string Milliseconds(std::chrono::milliseconds duration) {
  return std::to_string(duration.count()) + " ms";
}

FetchResult Failure(FetchState state, std::string message) {
  FetchResult result;
  result.state = state;
  result.message = std::move(message);
  return result;
}

// One place decides what a gRPC status means for the agent.
FetchResult FromStatus(const grpc::Status& status, std::string_view call,
                       const ClientOptions& options) {
  const std::string where = std::string(call) + " on " + options.endpoint + ": ";
  const std::string& detail = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return Failure(FetchState::kUnavailable, where + "unavailable: " + detail);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Failure(FetchState::kDeadlineExceeded,
                     where + "deadline of " + Milliseconds(options.callTimeout) + " exceeded");
    case grpc::StatusCode::UNIMPLEMENTED:
      return Failure(FetchState::kUnimplemented, where + "unimplemented: " + detail);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // gRPC reports an oversized answer with the same code as kubelet's rate limit, but
      // backing off would not help with it.
      if (detail.find("larger than max") != std::string::npos) {
        return Failure(FetchState::kMessageTooLarge,
                       where + "answer exceeds the receive limit of " +
                           std::to_string(options.maxReceiveBytes) + " bytes: " + detail);
      }
      return Failure(FetchState::kResourceExhausted, where + "rate limited: " + detail);
    case grpc::StatusCode::UNKNOWN:
      // kubelets before 1.28 with the KubeletPodResourcesGetAllocatable gate off answer a
      // plain Go error ("Pod Resources API GetAllocatableResources disabled"): the RPC is as
      // good as missing.
      if (call == "GetAllocatableResources" && detail.find("disabled") != std::string::npos) {
        return Failure(FetchState::kUnimplemented, where + "disabled: " + detail);
      }
      break;
    default:
      break;
  }
  return Failure(FetchState::kOther, where + "gRPC status " +
                                         std::to_string(static_cast<int>(status.error_code())) +
                                         ": " + detail);
}

bool DropsChannel(FetchState state) {
  return state == FetchState::kUnavailable || state == FetchState::kSocketAbsent;
}

}  // namespace

Client::Client(ClientOptions options) : options_(std::move(options)) {}

Client::~Client() = default;

FetchResult Client::Fetch() {
  if (auto absent = SocketAbsent(options_)) {
    channel_.reset();
    return std::move(*absent);
  }
  if (!channel_) {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(options_.maxReceiveBytes);
    auto channel =
        grpc::CreateCustomChannel(options_.endpoint, grpc::InsecureChannelCredentials(), arguments);
    auto stub = v1::PodResourcesLister::NewStub(channel);
    channel_ = std::make_unique<Channel>(Channel{std::move(channel), std::move(stub)});
  }

  // Every call gets its own deadline and fails fast while the socket refuses, instead of
  // waiting out the deadline for a connection.
  auto call = [this](auto method, const auto& request, auto& response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.callTimeout);
    context.set_wait_for_ready(false);
    return (channel_->stub.get()->*method)(&context, request, &response);
  };
  auto fail = [this](const grpc::Status& status, std::string_view name) {
    FetchResult result = FromStatus(status, name, options_);
    if (DropsChannel(result.state)) {
      channel_.reset();
    }
    return result;
  };

  Allocation allocation;
  {
    v1::AllocatableResourcesResponse response;
    const grpc::Status status = call(&v1::PodResourcesLister::Stub::GetAllocatableResources,
                                     v1::AllocatableResourcesRequest{}, response);
    if (!status.ok()) {
      return fail(status, "GetAllocatableResources");
    }
    for (const auto& devices : response.devices()) {
      auto& list = allocation.allocatable[devices.resource_name()];
      const auto numa = NumaNodes(devices);
      for (const auto& id : devices.device_ids()) {
        list.push_back(AllocatableDevice{id, numa});
      }
    }
  }
  {
    v1::ListPodResourcesResponse response;
    const grpc::Status status =
        call(&v1::PodResourcesLister::Stub::List, v1::ListPodResourcesRequest{}, response);
    if (!status.ok()) {
      return fail(status, "List");
    }
    allocation.pods.reserve(static_cast<size_t>(response.pod_resources_size()));
    for (const auto& pod : response.pod_resources()) {
      PodAllocation podAllocation{pod.namespace_(), pod.name(), {}};
      for (const auto& container : pod.containers()) {
        ContainerAllocation containerAllocation{container.name(), {}};
        for (const auto& devices : container.devices()) {
          auto& ids = containerAllocation.devices[devices.resource_name()];
          ids.insert(ids.end(), devices.device_ids().begin(), devices.device_ids().end());
        }
        podAllocation.containers.push_back(std::move(containerAllocation));
      }
      allocation.pods.push_back(std::move(podAllocation));
    }
  }
  FetchResult result;
  result.state = FetchState::kOk;
  result.allocation = std::move(allocation);
  return result;
}

}  // namespace cozy::podresources
