// What a pod-resources fetch answers, and the endpoint rules, without gRPC: the agent's pure
// code and the light `gpu-agent scan` (no kubelet socket, no gRPC loaded) use only this.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "podresources/allocation.h"

namespace cozy::podresources {

inline constexpr std::string_view kDefaultEndpoint =
    "unix:///var/lib/kubelet/pod-resources/kubelet.sock";

// Why kubelet gave no answer. Every kubelet behaviour maps to one of these; none throws.
enum class FetchState {
  kOk,
  kSocketAbsent,       // no socket file at the path: kubelet down, restarting, or wrong path
  kUnavailable,        // a socket file, but nobody accepts or the connection broke
  kDeadlineExceeded,   // kubelet accepted but did not answer in time (a hung kubelet)
  kUnimplemented,      // no GetAllocatableResources (kubelet < 1.21 or gate off): units unknown
  kResourceExhausted,  // kubelet's rate limit (100 QPS, burst 10): back off before asking again
  kMessageTooLarge,    // the answer exceeded the receive limit: asking again will not help
  kOther,              // any other gRPC error
};

// Stable lower-case name for logs, metrics and the scan output ("socketAbsent", ...).
std::string_view ToString(FetchState state);

struct FetchResult {
  FetchState state = FetchState::kOther;
  // Present only when state is kOk.
  std::optional<Allocation> allocation;
  // One line for people, naming the call and the endpoint: "GetAllocatableResources on
  // unix:///...: deadline of 5000 ms exceeded". Empty when kOk.
  std::string message;
};

struct ClientOptions {
  std::string endpoint{kDefaultEndpoint};
  // Deadline of each call; a fetch makes at most two calls.
  std::chrono::milliseconds callTimeout{5000};
  // As upstream's examples: a node with thousands of pods still fits.
  int maxReceiveBytes = 16 * 1024 * 1024;
};

// The filesystem path of a "unix:" endpoint ("unix:///abs/path" or "unix:rel/path"); nullopt
// for other schemes, which are dialled as they are.
std::optional<std::string> UnixSocketPath(std::string_view endpoint);

// The failure a fetch answers without dialling when the endpoint is a unix socket path with
// no file there (kSocketAbsent, naming the path and errno); nullopt when there is something to
// dial.
std::optional<FetchResult> SocketAbsent(const ClientOptions& options);

}  // namespace cozy::podresources
