// The binder: with --enable-gpu, the leader turns the model's decisions for one pass into status
// writes on GPUDevices, and answers the webhooks' bind requests. It is the only writer of
// placement (D1); passes never overlap (D2), since one worker thread runs them all.
//
// Every write is a status merge patch conditional on the resourceVersion the pass read; a
// conflict fails that write, counts, stops the pass, and the pass after re-reads. Decisions come
// from the model alone (controller/model): the binder adds I/O, never a rule.
//
// Writes go out over up to kWriters connections at once (docs/controller.md, "Concurrent writes"),
// as a pipeline: the decisions that free no units (binds, answers, keeps that answer) stand on
// nothing written before them, so each is handed to the next free writer as the pass reaches it; a
// decision that frees units (a move off a node, a device lost) is sent alone, once every write
// before it is in and before any after it, which may take what it frees. What comes of each write
// is taken in the plan's order, as if they had gone one after the other, and its Event is handed to
// the writers behind it. A conflict or a server error stops the pass: writes not sent yet are not
// sent, and those in flight beside it (binds and answers: they took units only, so none stood
// on it) are taken as they come.
//
// A device whose write the server refuses for what the device is (400, 403, 404, 422: a policy
// or webhook of the hoster's refusing the status, say) is held off on its own (docs/controller.md,
// "A device the server refuses"): it waits 1 s, doubling to 1 min, before its write is sent again,
// or until the device changes (a new resourceVersion goes at once), and the rest of the pass goes
// on without it where that is safe: a decision that only takes units (a bind, an answer) is one no
// later decision stands on; one that frees units (a move off a node, a device lost) is, so a pass
// stops before it while it is held off. The pass says when the first held-off device may be tried
// again, and the loop runs a pass then. Before, one such device stopped every pass at it and the
// pass ran again every 50 ms, the decisions after it never written. An error of the server's (5xx,
// 429, a dropped connection) is no device's: the pass stops there, as on a conflict.
//
// Reading past a cache that lags the binder's own writes (D3) is ReadPastCache's
// (controller/binder/read_past.h); the TakesBinds conditions of the GPUNodes are
// WriteNodeConditions' (controller/binder/node_conditions.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/gpudevice.h"
#include "controller/binder/catalog.h"
#include "controller/binder/events.h"
#include "controller/binder/node_conditions.h"
#include "controller/binder/read_past.h"
#include "controller/model/model.h"
#include "controller/model/snapshot.h"
#include "kube/backoff.h"
#include "kube/client.h"
#include "kube/clock.h"
#include "kube/errors.h"
#include "kube/leader_election.h"
#include "runtime/worker.h"
#include "runtime/worker_pool.h"

namespace cozy::controller {

struct BinderResult {
  std::map<std::string, int64_t> decisions;  // by action (bind, move, lost, keep, refuse)
  int64_t writes = 0;                        // placement and answer patches that applied
  int64_t conditionWrites = 0;               // GPUNode TakesBinds conditions that changed
  int64_t events = 0;                        // Events for tenants, handed to the sender
  int64_t eventsSuppressed = 0;              // repeats held back by the rate limit
  int64_t conflicts = 0;
  int64_t failures = 0;                 // other failed writes
  std::vector<double> answerLatencies;  // seconds from requestedAt to the answer
  std::string error;                    // the pass did not run (G7, a bad snapshot)
  int readPastCache = 0;                // D3: devices read past the cache (GETs)
  int fromOwnWrites = 0;                // D3: devices taken from the answers to its own writes
  // Devices the server holds that do not decode (skipped, as the cache skips them): one bad
  // object must not stop every pass. "namespace/name: why" each.
  std::vector<std::string> undecodable;
  // A write failed where the decisions after it assumed it (a conflict, a server error, a write
  // that frees units): the pass stopped there; the next pass decides again from what the
  // server holds.
  bool incomplete = false;
  // Held off after the server refused their writes (see above): decisions not sent this pass,
  // and whether the pass stopped before one that frees units.
  int64_t heldOff = 0;
  bool stoppedAtHeldOff = false;
  size_t backingOff = 0;  // devices held off at the end of the pass
  // When the first held-off device may be tried again: a pass is due then.
  std::optional<std::chrono::steady_clock::time_point> retryAt;
  // A full pass that decided only held keeps (model::kHeldReason): the room it left, which
  // pod changes may take without a pass (BinderLoop's QuietRoom; docs/controller.md, "Who wakes for
  // a change").
  std::optional<model::FreeUnits> quietRoom;
  // Where the pass's time went (the debug log's "binder pass" line): the model's plan, and the
  // writes with their Events.
  double planSeconds = 0;
  double writeSeconds = 0;
  // C18: inputs the model read the way that fails closed for their own owner
  // (model::InputProblem), each with a Warning Event on its object; counted by kind.
  std::vector<model::InputProblem> inputProblems;
  // A full pass whose model was built: the catalog it shows (docs/controller.md, "Catalog
  // metrics"), from that model's CapacityView; null otherwise.
  std::shared_ptr<const CatalogFigures> catalog;
};

class Binder {
 public:
  inline static const std::string kFieldManager = "gpu-controller-binder";

  // Events: what a tenant must know about a device (bound, moved, Lost, refused and why), as
  // events.k8s.io/v1 Events regarding the GPUDevice. The same event (device, reason, message)
  // is written at most once per kEventRepeat, and at most kEventsPerPass per pass, so a pending
  // order refused pass after pass does not flood the namespace. A pass hands its Events to a
  // sender of their own, one at a time on one connection, as client-go's recorder does: they
  // never hold up the pass or the next one, and take one connection of the API server's time
  // beside the kWriters of the placement writes a VM start waits on (a fifth of the API
  // server's work, at a thousand binds at once, before). Past kEventQueue waiting, an Event is
  // dropped and counted. The recording is EventRecorder's (controller/binder/events.h).
  static constexpr std::chrono::minutes kEventRepeat = EventRecorder::kRepeat;
  static constexpr int kEventsPerPass = EventRecorder::kPerPass;
  static constexpr int64_t kEventQueue = EventRecorder::kQueue;
  // How many Events may wait for the sender, the one it is sending included (kEventQueue by
  // default). Before the first pass.
  void SetEventQueueLimit(int64_t limit) { events_.SetQueueLimit(limit); }
  // Waits until every Event handed over is sent (or failed), at most `limit`; whether they are.
  bool WaitForEvents(std::chrono::milliseconds limit);
  // Events the sender wrote, those it could not write, and those dropped for want of room. Any
  // thread.
  int64_t EventsWritten() const { return events_.Written(); }
  int64_t EventsFailed() const { return events_.Failed(); }
  int64_t EventsDropped() const { return events_.Dropped(); }

  // `leadership` is read before every write, and its deadline before every attempt of each,
  // retries included: no write is sent, retried or left running past the instant the replica
  // leads until (kube::Leadership::Deadline). `identity` names this replica in Events.
  // `time` paces the per-device backoff (a fake in tests; the steady clock by default).
  Binder(kube::Client& client, const kube::Leadership& leadership, std::string identity = "",
         kube::TimeSource* time = nullptr);

  // A refused device's wait before its write is sent again: 1 s, doubling to 1 min.
  static constexpr kube::BackoffPolicy kWriteRetry{std::chrono::seconds(1), std::chrono::minutes(1),
                                                   2.0, 0.0};

  // Reading past the cache (D3): what the loop asks before each pass
  // (controller/binder/read_past.h); the writes of the passes tell it what they wrote.
  ReadPastCache& readPast() { return readPast_; }

  // One pass over `snapshot`. `answersOnly`: the fast pass (D4), which writes only for devices
  // with an unanswered bind request, with the full pass's decisions, and the decisions before
  // them that free units (a move off a node, a device lost), since a later bind in the plan may
  // take what they free. `vmisKnown`: whether the
  // snapshot's VMIs are complete (the kind served and its cache synced); while it is not, a
  // pass with an attached device fails instead of reading the VMI as gone (G7).
  BinderResult Pass(const model::Snapshot& snapshot, bool answersOnly, bool vmisKnown,
                    std::chrono::system_clock::time_point now);

  // The TakesBinds condition of every GPUNode, written where it changed, as the binder's writes
  // are (controller/binder/node_conditions.h). Returns the writes made.
  int64_t WriteNodeConditions(const model::Snapshot& snapshot,
                              std::chrono::system_clock::time_point now) {
    return controller::WriteNodeConditions(client_, write_, leadership_, snapshot, now);
  }

  // C17: a Warning Event (reason ResourceNameNotPermitted) regarding each GPUClass whose
  // resource name no entry of KubeVirt's permittedHostDevices names (model::
  // IsPermittedHostDevice), rate limited as the device Events. Only while the snapshot has a
  // table (KubeVirt served, its object read, at least one entry); deleting classes are skipped.
  // Cluster-scoped classes get their Events in kClusterEventNamespace, as client-go's recorder
  // does.
  inline static const std::string kClusterEventNamespace = EventRecorder::kClusterNamespace;
  void ReportUnpermittedClasses(const model::Snapshot& snapshot,
                                std::chrono::system_clock::time_point now, BinderResult& result);
  // C18: the last full pass's model's input problems, each as a Warning Event on its object
  // (rate-limited as every Event is), into result.inputProblems.
  void ReportInputProblems(std::chrono::system_clock::time_point now, BinderResult& result);

  // How many placement writes (and their Events) are in flight at once at most, each on a
  // connection of its own.
  static constexpr size_t kWriters = 8;

 private:
  // One decision's status patch, and what came of it.
  struct PlacementWrite {
    const api::GpuDevice* device = nullptr;
    const model::Decision* decision = nullptr;
    nlohmann::json body;   // {"status": ...}
    std::string key;       // "ns/name"
    bool pending = false;  // it answers a bind request
    bool frees = false;    // it takes the device off a node it holds units on
    bool written = false;
    bool skipped = false;                    // not sent: the pass stopped before a writer took it
    std::optional<kube::ErrorKind> failure;  // the server's refusal, or the request's failure
    // The server's answer to the write: the device as it made it (decoded only if a pass
    // needs it, D3).
    std::shared_ptr<const nlohmann::json> answer;
    std::string error;
    std::exception_ptr thrown;      // anything else, thrown again on the binder's thread
    std::atomic<bool> done{false};  // a writer is through with it (the fields above are set)
  };
  // Any thread: sends the write (unless `halt`), noting what came of it in the write itself;
  // raises `halt` where the pass must stop there.
  // A pass in its three steps: plan (the model's decisions), match (each decision's device),
  // write (the pipeline above).
  std::optional<std::vector<model::Decision>> Plan(const model::Snapshot& snapshot,
                                                   bool answersOnly, BinderResult& result);
  struct DeviceMatch {
    std::vector<const api::GpuDevice*> deviceOf;  // by decision; null: nothing to write
    size_t lastPending = 0;  // an answers-only pass: after the last decision with a request
  };
  static DeviceMatch MatchDevices(const model::Snapshot& snapshot,
                                  const std::vector<model::Decision>& decisions, bool answersOnly,
                                  BinderResult& result);
  static std::optional<nlohmann::json> StatusPatch(const api::GpuDevice& device,
                                                   const model::Decision& decision,
                                                   std::chrono::system_clock::time_point now,
                                                   BinderResult& result);
  void Write(const std::vector<model::Decision>& decisions, const DeviceMatch& match,
             bool answersOnly, std::chrono::system_clock::time_point now, kube::TimePoint steadyNow,
             BinderResult& result);
  void Send(PlacementWrite& write, std::atomic<bool>& halt);
  // The binder's thread, in the plan's order: what came of one write, as the serial loop took
  // it (counts, backoff, logs); its Event, if any, in `event`. Returns false where the pass must
  // stop: a write failed that decisions after it may stand on.
  bool TakeWrite(PlacementWrite& write, kube::TimePoint steadyNow,
                 std::chrono::system_clock::time_point now, BinderResult& result,
                 std::optional<EventRecorder::Pending>& event);
  kube::Client& client_;
  const kube::Leadership& leadership_;
  // The options of every write: the field manager, and the lease's deadline on each attempt.
  kube::WriteOptions write_;
  // A device's Event for a decision (bound, moved, Lost, refused), or none.
  std::optional<EventRecorder::Pending> PrepareDeviceEvent(
      const api::GpuDevice& device, const model::Decision& decision,
      std::chrono::system_clock::time_point now, BinderResult& result);

  kube::TimeSource& time_;
  // The last pass's snapshot (its own copy: lists shared) and model, which the next pass's model
  // is built with (Model(snapshot, previous)). The model goes first: it views the snapshot.
  std::unique_ptr<const model::Snapshot> lastSnapshot_;
  std::unique_ptr<const model::Model> lastModel_;
  kube::KeyedBackoff writeBackoff_{kWriteRetry};  // "ns/name" -> its refused writes in a row
  ReadPastCache readPast_{client_};
  // The placement writes' threads, up to kWriters, for as long as the binder.
  runtime::WorkerPool writers_{"binder-writer", kWriters};
  EventRecorder events_;  // declared last: its sender stops before the rest goes
};

}  // namespace cozy::controller
