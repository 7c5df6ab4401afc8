// Publishes this node's ResourceSlice for the catalog's DRA driver (docs/dra.md, "The agent's
// ResourceSlice"): one slice named after the node, pool = node name, its generation bumped on
// every change, owned by the Node. Like the GPUNode's publisher it writes nothing while the
// server holds what it would write, and failures come back as a time to try again. A watch on
// the node's slices (SliceWatch) repairs a slice deleted or changed by someone else: kubelet
// deletes every slice of its node when it starts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/dra/kubelet_plugin.h"
#include "agent/sources/publish.h"
#include "kube/backoff.h"
#include "kube/client.h"
#include "kube/informer.h"
#include "kube/informer_loop.h"

namespace cozy::agent {

// The slice writer, as a StatusPublisher of the publish source: what it is offered is the
// devices array (SliceDevices). Publish and Invalidate run on the source's thread;
// IsWhatWasWritten on the watch's.
class SlicePublisher : public StatusPublisher {
 public:
  SlicePublisher(kube::Client& client, std::string nodeName,
                 kube::BackoffPolicy backoff = {std::chrono::seconds(1), std::chrono::seconds(60),
                                                2.0, 1.0});
  PublishAttempt Publish(const nlohmann::json& devices) override;
  std::optional<std::chrono::milliseconds> ReadyIn() override;
  void Invalidate() override;

  // Whether `slice` (as the server holds it) is the agent's slice as last written. False for
  // other slices, and before the first write.
  bool IsWhatWasWritten(const nlohmann::json& slice) const;
  // The pool generation last written (0 before).
  int64_t generation() const;

 private:
  // Publish's work; throws what the client throws.
  bool WriteIfChanged(const nlohmann::json& devices);
  std::string NodeUid();
  void Remember(const nlohmann::json& sent, const nlohmann::json& answer);

  kube::Client& client_;
  const std::string nodeName_;
  const std::string sliceName_;
  const std::string collectionPath_;
  const std::string slicePath_;
  kube::Backoff backoff_;
  std::string nodeUid_;
  std::string lastError_;
  bool taintsChecked_ = false;          // a dry run showed whether the server keeps device taints
  bool taintsDropped_ = false;          // ... and it does not: publish no device
  mutable std::mutex mutex_;            // guards the four below (read by the watch's thread)
  std::optional<nlohmann::json> sent_;  // the devices last written or found on the server
  nlohmann::json echo_;      // ... and the spec the server answered with (compared by the watch)
  std::string echoVersion_;  // ... at this resourceVersion
  int64_t generation_ = 0;
};

// The node's slices of this driver from the API server (list + watch, field selector
// spec.nodeName), on an informer loop of its own (thread `slice-watch`). When the agent's slice
// is deleted, or changed into something the agent did not write, it asks for a repair on the
// daemon's loop. A source of the daemon that never asks for a pass.
class SliceWatch : public Source, private kube::LoopMember {
 public:
  SliceWatch(kube::Client& client, const std::string& nodeName, const SlicePublisher& publisher);
  ~SliceWatch() override;
  std::string_view Name() const override { return "slice watch"; }
  // Loop thread, before Start: what a repair does.
  void OnDrift(std::function<void(std::string_view why)> repair) { repair_ = std::move(repair); }
  void Start(runtime::Loop& loop, Changed changed) override;

 private:
  Next Step(kube::TimePoint now, bool mayList) override;
  bool ListDue(kube::TimePoint now) const override { return informer_.ListDue(now); }
  std::string LoopName() const override { return "resourceslices"; }
  void OnEvent(const kube::WatchEvent& event);

  kube::Client& client_;
  const std::string sliceName_;
  const SlicePublisher& publisher_;
  std::function<void(std::string_view)> repair_;
  runtime::Loop* loop_ = nullptr;
  kube::Informer informer_;
  std::string lastError_;
  std::unique_ptr<kube::InformerLoop> watching_;  // last: stopped before the rest goes
};

// What `run` hands the daemon for `--resource-slices`: the writer, the watch on it, and the
// driver's kubelet plugin.
struct SliceOutput {
  std::unique_ptr<SlicePublisher> publisher;
  std::unique_ptr<SliceWatch> watch;      // none: repaired at resyncs only
  std::unique_ptr<KubeletPlugin> plugin;  // none: kubelet cannot prepare the slice's devices
};

}  // namespace cozy::agent
