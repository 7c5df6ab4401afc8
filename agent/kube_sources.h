// The daemon's two ties to the API server: the GPUNode publisher as the loop's StatusPublisher,
// and the node's pods (field selector spec.nodeName) as its PodWatch. Both are driven by the
// loop and never sleep in it.
#pragma once

#include <memory>
#include <string>

#include "agent/daemon.h"
#include "agent/publisher.h"
#include "kube/client.h"
#include "kube/informer.h"

namespace cozy::agent {

class ApiStatusPublisher : public StatusPublisher {
 public:
  ApiStatusPublisher(kube::Client& client, const std::string& nodeName);
  std::optional<std::chrono::milliseconds> Publish(const nlohmann::json& status) override;
  // While the client's rate limit (client-go's 5 qps, burst 10) has no token: how long until it
  // has one.
  std::optional<std::chrono::milliseconds> ReadyIn() override;

 private:
  kube::Client& client_;
  Publisher publisher_;
  std::string lastError_;
};

class ApiPodWatch : public PodWatch {
 public:
  ApiPodWatch(kube::Client& client, const std::string& nodeName);
  std::chrono::steady_clock::time_point Step(std::chrono::steady_clock::time_point now) override;
  std::vector<Fd> Fds() override;
  const PodPhases& Phases(bool& changed) override;
  bool Synced() const override { return informer_.Synced(); }

 private:
  kube::Informer informer_;
  PodPhases phases_;
  bool changed_ = false;
  std::string lastError_;
};

// The client settings the daemon uses: no retries inside a call (the publisher and the
// informer schedule their own), short timeouts so a hung API server cannot stall the loop.
kube::ClientOptions LoopClientOptions();

}  // namespace cozy::agent
