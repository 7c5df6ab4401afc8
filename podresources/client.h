// Client of kubelet's pod-resources v1 API over a unix socket: one bounded call each to
// GetAllocatableResources and List, answered as an Allocation value or as a typed state.
// Kept thin, like kubelet's own reference client: explicit deadlines and message size, no
// retries (the caller's loop decides when to ask again).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "podresources/fetch.h"

namespace cozy::podresources {

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // GetAllocatableResources, then List. Stops at the first failure and reports it. The channel
  // is kept between fetches and dropped after a connection failure, so a restarted kubelet
  // (a new socket at the same path) is dialled afresh.
  FetchResult Fetch();

  const ClientOptions& options() const { return options_; }

 private:
  struct Channel;
  ClientOptions options_;
  std::unique_ptr<Channel> channel_;
};

}  // namespace cozy::podresources
