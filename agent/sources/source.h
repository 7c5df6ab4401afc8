// An input of the agent behind the one interface the daemon knows. The daemon starts each source
// on its loop, runs a pass when any of them says its input changed, and asks them all to read
// again on a resync; it knows nothing of udev, gRPC or the API server. Sources that block
// (kubelet's gRPC, the API server) do so on threads of their own and hand results to the loop,
// so a hung kubelet or an API server answering after 9 s never holds the loop.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "runtime/loop.h"

namespace cozy::agent {

class Source {
 public:
  // Called on the loop thread when a source's input changed. `debounce`: the change comes in
  // bursts (device events) and may wait for the debounce window; else the pass runs now.
  using Changed = std::function<void(std::string_view reason, bool debounce)>;

  virtual ~Source() = default;
  virtual std::string_view Name() const = 0;
  // Registers the source's loop sources and starts its work; `changed` asks for a pass.
  virtual void Start(runtime::Loop& loop, Changed changed) = 0;
  // Whether the source has its first answer (or gave up on it): the first pass waits for every
  // source to be settled, up to a deadline, so the first publish is complete.
  virtual bool Settled() const { return true; }
  // Read again now: the slow resync, SIGHUP, D-Bus Rescan(). `force`: an operator asked
  // (SIGHUP, Rescan()), so a source that is backing off reads anyway; else the backoff holds.
  virtual void Refresh(bool force) { (void)force; }
};

}  // namespace cozy::agent
