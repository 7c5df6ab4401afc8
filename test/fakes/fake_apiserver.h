// A fake Kubernetes API server for tests and the demo: real HTTP on 127.0.0.1, faithful to
// research/k8s-api.md where the agent and kubectl can tell (discovery, Status errors, the
// plain 404 of an unserved kind, status subresource, merge and JSON patch, resourceVersion,
// generation, 409, watch with bookmarks and 410, selectors, CRD schemas and printer columns),
// and where a controller lives: ConfigMaps, Secrets, ResourceQuotas, Events (core
// and events.k8s.io/v1, one storage) and Leases with their validation basics, finalizers and
// deletionTimestamp, namespaces that must exist and their termination, dryRun on every write,
// delete preconditions, owner-reference garbage collection (background, foreground, orphan),
// hundreds of concurrent watches, admission webhooks (mutating with reinvocation, validating,
// over HTTPS with their caBundle); plus what no real server has: fault injection, a request
// log, a service-endpoint map for webhooks and a virt-api VMI mutator stand-in.
// docs/kubernetes.md has the control API.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace cozy::fake {

// What a faulted request gets instead of a well-formed answer. A list mode hits only a GET of
// a collection (a JSON list, not kubectl's Table), a watch mode only a watch=1 request; a
// fault with such a mode is spent only by the requests it changes.
enum class FaultMode {
  kNone,
  // Lists: the real items, with one thing of the wrong type (200, valid JSON).
  kListResourceVersionNumber,  // "listResourceVersionNumber": metadata.resourceVersion 123
  kListItemsNotArray,          // "listItemsNotArray": items is an object keyed by name
  kListWithoutMetadata,        // "listWithoutMetadata": no metadata at all
  // Watches: after the initial ADDED events (if any), one bad event, then the stream goes on
  // as usual (a client that reads on past it would see the rest).
  kWatchResourceVersionNumber,  // "watchResourceVersionNumber": ADDED, resourceVersion 123
  kWatchMetadataMissing,        // "watchMetadataMissing": MODIFIED object without metadata
  kWatchObjectNotObject,        // "watchObjectNotObject": ADDED whose object is a string
  kWatchUnknownType,            // "watchUnknownType": type "RENAMED", a proper object
  kWatchNotJson,                // "watchNotJson": a balanced frame that is not JSON
  kWatchErrorWrongTypes,        // "watchErrorWrongTypes": an ERROR event whose Status has
                                // code "500" (a string), reason 7, message an array
  kWatchCloseAtOnce,            // "watchCloseAtOnce": 200, then the stream ends, no events
  // Any request (endlessBody: not watches): 200 and a body that does not end, streamed until
  // the client hangs up, the server stops, or kEndlessFor has passed.
  kEndlessBody,    // "endlessBody": Content-Length 200 MiB (kEndlessBodyBytes), a list's
                   // start then blanks
  kEndlessString,  // "endlessString": chunked, a list (or, on a watch, an ADDED event) whose
                   // first item's name is a string that never closes
};
std::string_view FaultModeName(FaultMode mode);
// Throws std::invalid_argument naming the known modes.
FaultMode ParseFaultMode(std::string_view name);

inline constexpr uint64_t kEndlessBodyBytes = uint64_t{200} << 20;
inline constexpr std::chrono::seconds kEndlessFor{30};

// The namespaces every server starts with, as a real cluster has them; the first three may
// not be deleted (the NamespaceLifecycle plugin's immortal namespaces: 403).
inline constexpr const char* kSystemNamespaces[] = {"default", "kube-system", "kube-public",
                                                    "kube-node-lease"};
inline constexpr const char* kImmortalNamespaces[] = {"default", "kube-system", "kube-public"};

// A fault matches requests by method and path prefix and changes their answer.
struct Fault {
  std::string method;               // "" = every method
  std::string pathPrefix;           // "" = every path (control paths are never faulted)
  bool watchOnly = false;           // only requests with watch=1
  std::string bearerToken;          // "" = every caller; else only this token's (one replica)
  int status = 0;                   // answer this code instead (0: do not change the answer)
  int retryAfterSeconds = -1;       // Retry-After header (and Status details) when >= 0
  bool retryAfterHttpDate = false;  // send that Retry-After as an HTTP-date (IMF-fixdate,
                                    // now + retryAfterSeconds), as a proxy may
  std::string retryAfterRaw;        // send this Retry-After header verbatim (wins over the above)
  int latencyMs = 0;                // wait before answering
  bool dropConnection = false;      // cut the connection after the headers: no valid response
  FaultMode mode = FaultMode::kNone;
  int count = -1;  // how many requests it hits; -1 until cleared
  int skip = 0;    // the first `skip` requests it matches pass unchanged (a write after a read)
  // Answers `status` to the next `count` requests (of `method`, when given).
  static Fault Answer(int status, int count, std::string method = "", int retryAfterSeconds = -1);
  // Cuts the connection of the next `count` requests (of `method`, when given).
  static Fault Drop(int count, std::string method = "");
  // Gives the next `count` requests under `pathPrefix` that the mode applies to its answer.
  static Fault Mode(FaultMode mode, int count = -1, std::string pathPrefix = "");
  // Strict: an unknown field, a field of the wrong type or an unknown mode throws
  // std::invalid_argument naming it.
  static Fault FromJson(const nlohmann::json& json);
  nlohmann::json ToJson() const;
};

struct LoggedRequest {
  std::string method;
  std::string path;
  std::string query;  // raw, without '?'
  std::string contentType;
  std::string accept;
  std::string body;
  std::string bearerToken;  // "" when none was sent
  int status = 0;           // the answer's code (200 for a watch that started streaming)
  std::string fault;        // the fault that changed the answer: a mode name, "status",
                            // "drop"; "" for none (a latency alone is not named)
  uint64_t bytesSent = 0;   // body bytes written, for the endless modes
  std::chrono::steady_clock::time_point received;  // when the request was read
  nlohmann::json ToJson() const;
};

// Who a bearer token authenticates as: sent to admission webhooks as AdmissionReview
// request.userInfo (authentication.k8s.io/v1 UserInfo; extra values are string lists).
struct UserInfo {
  std::string username;
  std::string uid;
  std::vector<std::string> groups;
  std::map<std::string, std::vector<std::string>> extra;
  nlohmann::json ToJson() const;
  // Strict: {username, uid?, groups?, extra?}; throws std::invalid_argument.
  static UserInfo FromJson(const nlohmann::json& json);
};

// What an unknown or empty token authenticates as (a cluster admin's client certificate).
UserInfo DefaultAdmin();

struct FakeApiServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                                 // 0: any free port
  std::vector<std::filesystem::path> crdPaths;  // files or folders of CRD YAML, loaded at start
  std::chrono::milliseconds bookmarkInterval{1000};  // real servers: about a minute
  size_t historyLimit = 10000;  // watch events kept for resuming; older ones are compacted
  // A brownout: every request (lists and watches too, not the control API) is answered only
  // after this long, on top of any fault's latency.
  std::chrono::milliseconds requestDelay{0};
  // The client certificate and key (PEM files) presented to every webhook, as kube-apiserver
  // presents the one its admission configuration's kubeconfig names (docs/install.md, "Who may
  // call the webhooks"); empty: none, as a server without that configuration.
  std::filesystem::path webhookClientCertificate;
  std::filesystem::path webhookClientKey;
  // The feature gate DRADeviceTaints (on by default in Kubernetes 1.36): off, the server drops
  // spec.devices[].taints of every ResourceSlice it is sent, as a real one drops a disabled
  // gate's fields.
  bool draDeviceTaints = true;
};

class FakeApiServer {
 public:
  // One write as admission sees it (defined in fake_apiserver_internal.h).
  struct Admission;

  explicit FakeApiServer(FakeApiServerOptions options = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // Binds and starts serving on a thread of its own; throws if it cannot bind.
  void Start();
  void Stop();
  int port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:PORT
  // A kubeconfig pointing at this server (token: the bearer token to send, may be empty).
  std::string Kubeconfig(const std::string& token = "") const;

  // In-process control, the same as the /_fake/ endpoints.
  void AddFault(const Fault& fault);
  void ClearFaults();
  // The brownout delay (FakeApiServerOptions::requestDelay) from now on; 0 ends it.
  void SetRequestDelay(std::chrono::milliseconds delay);
  std::chrono::milliseconds RequestDelay() const;
  std::vector<LoggedRequest> Requests() const;
  void ClearRequests();
  // Only these bearer tokens are accepted (401 otherwise); empty accepts anything.
  void SetAcceptedTokens(std::set<std::string> tokens);
  void DropWatches();    // ends every open watch stream (a clean end of stream)
  void ExpireWatches();  // sends every open watch a 410 Expired ERROR event, compacts history
  void Compact();        // forgets every event so far: a resume from an older RV gets 410
  // Admission (docs/kubernetes.md "Admission webhooks"). The user a bearer token stands for,
  // as admission webhooks see it; the real authenticator's group `system:authenticated` is
  // added when missing. A token without a user is DefaultAdmin(). (Whether a token is accepted
  // at all is SetAcceptedTokens'.)
  void SetUser(const std::string& token, UserInfo user);
  // Where a webhook's clientConfig.service is served: `<name>.<ns>.svc:<port>` is connected
  // to host:port instead (the certificate is still verified for `<name>.<ns>.svc`). A service
  // without an endpoint fails the call as a real server does when it has none.
  void SetServiceEndpoint(const std::string& ns, const std::string& name, int port,
                          std::string host = "127.0.0.1");
  // A Service with several ready endpoints (replicas) on 127.0.0.1: each webhook call to it
  // goes to the next in turn (from the first, for the next call), as the real server picks one
  // per call, so a reinvocation can reach another replica than the first call did.
  void SetServiceEndpoints(const std::string& ns, const std::string& name,
                           const std::vector<int>& ports);
  // A stand-in for KubeVirt virt-api's VirtualMachineInstance mutating webhook, run as if it
  // were the webhook of a MutatingWebhookConfiguration named "virt-api-mutator" (so a
  // configuration named before it runs first): on CREATE of kubevirt.io/v1
  // virtualmachineinstances it sets spec.domain.machine.type q35 and
  // spec.domain.firmware.uuid when missing and the kubevirt.io/latest-observed-api-version and
  // kubevirt.io/storage-observed-api-version annotations.
  void EnableVirtApiMutator(bool enabled = true);
  // Loads a CustomResourceDefinition object (as a POST of it would).
  void LoadCrd(const nlohmann::json& crd);
  void DeleteCrd(const std::string& name);
  // Stores an object as a create would, without validation, admission (its namespace need not
  // exist) or the log; returns it. A namespaced object without a namespace goes to "default".
  nlohmann::json Seed(const nlohmann::json& object);
  // The stored object or null.
  nlohmann::json Object(const std::string& apiVersion, const std::string& plural,
                        const std::string& ns, const std::string& name) const;
  std::string CurrentResourceVersion() const;

 private:
  struct ResourceType;
  struct Event;
  struct Watcher;
  struct Outcome;

  void Serve(const httplib::Request& request, httplib::Response& response);
  // Takes (and spends) the first fault whose mode is of `listModes` or watch modes and that
  // matches the request, noting it in log entry `logIndex`.
  std::optional<Fault> TakeModeFault(const httplib::Request& request, bool listModes,
                                     size_t logIndex);
  void SendEndless(const httplib::Request& request, httplib::Response& response, FaultMode mode,
                   size_t logIndex);
  void WaitUnlessStopping(std::chrono::milliseconds delay);
  bool HandleControl(const httplib::Request& request, httplib::Response& response);
  Outcome Dispatch(const httplib::Request& request, httplib::Response& response, size_t logIndex);
  Outcome Discovery(const std::string& path, httplib::Response& response);
  std::shared_ptr<const ResourceType> FindType(const std::string& group, const std::string& version,
                                               const std::string& plural) const;
  void RegisterBuiltins();
  void RegisterCrdLocked(const nlohmann::json& crd);
  void UnregisterCrdLocked(const std::string& name);

  // Admission webhooks (fake_apiserver_admission.cpp). Neither holds mutex_ while a webhook
  // is called. Mutating: returns the object as the webhooks (and the virt-api stand-in) left
  // it; throws StatusError for a denial or a failed call under failurePolicy Fail. Warnings
  // go out as Warning headers on `response`.
  nlohmann::json AdmitMutating(const Admission& admission, httplib::Response& response);
  void AdmitValidating(const Admission& admission, httplib::Response& response);
  // Whether any webhook configuration exists, or the virt-api stand-in is on (otherwise
  // writes take the short path without admission).
  bool AdmissionConfiguredLocked() const;
  UserInfo UserFor(const httplib::Request& request) const;

  // What a DELETE asks for (DeleteOptions and the dryRun query).
  struct DeleteRequest {
    std::string propagationPolicy;  // "" (the default: background), Background, Foreground, Orphan
    std::string uid;                // preconditions.uid ("" = none)
    std::string resourceVersion;    // preconditions.resourceVersion ("" = none)
    std::optional<int64_t> gracePeriodSeconds;  // DeleteOptions or the query's; pods heed it
    bool dryRun = false;
  };

  // The writes. With dryRun each validates and answers as the real write would and stores
  // and emits nothing.
  // The NamespaceLifecycle admission plugin on a create into `ns`: 404 NotFound for a
  // namespace that does not exist, 403 Forbidden for one being terminated.
  void AdmitToNamespaceLocked(const ResourceType& type, const std::string& ns,
                              const std::string& name) const;
  nlohmann::json CreateLocked(const ResourceType& type, const std::string& ns,
                              nlohmann::json object, bool validate, bool dryRun = false);
  nlohmann::json WriteLocked(const ResourceType& type, const std::string& key,
                             const nlohmann::json& old, nlohmann::json updated, bool statusWrite,
                             bool dryRun = false);
  // A DELETE: preconditions, the garbage collector's finalizers, deletionTimestamp while
  // finalizers remain, otherwise the object goes.
  nlohmann::json DeleteLocked(const ResourceType& type, const std::string& key,
                              const DeleteRequest& request);
  // Stores a changed object under the next resourceVersion (MODIFIED); an object being
  // deleted whose last finalizer is gone is then removed (DELETED).
  nlohmann::json CommitLocked(const ResourceType& type, const std::string& key,
                              nlohmann::json object);
  void RemoveLocked(const ResourceType& type, const std::string& key);
  void DeleteCrdLocked(const std::string& name);
  // The controllers a real cluster runs beside the API server, run to a fixed point after
  // every write: the garbage collector and the namespace controller.
  void SettleLocked();
  void CollectGarbageLocked();
  // Keeps collectable_ up to date for an object just stored (null: just removed).
  void TrackCollectableLocked(const std::string& storeKey, const std::string& key,
                              const nlohmann::json* object);
  void FinalizeNamespacesLocked();
  std::shared_ptr<const ResourceType> TypeForStoreLocked(const std::string& storeKey) const;
  std::shared_ptr<const ResourceType> TypeForKindLocked(const std::string& apiVersion,
                                                        const std::string& kind) const;
  void RecordEventLocked(const ResourceType& type, const std::string& eventType,
                         const nlohmann::json& object);
  void Watch(const httplib::Request& request, httplib::Response& response,
             std::shared_ptr<const ResourceType> type, const std::string& ns, size_t logIndex);
  nlohmann::json Table(const ResourceType& type, const std::vector<nlohmann::json>& objects,
                       const std::string& resourceVersion) const;

  FakeApiServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t resourceVersion_ = 100;
  uint64_t uidCounter_ = 0;
  uint64_t compactedThrough_ = 0;  // events with RV <= this are gone
  uint64_t dropGeneration_ = 0;
  uint64_t expireGeneration_ = 0;
  bool stopping_ = false;
  bool settleNeeded_ = false;  // something the garbage collector or namespaces act on changed
  std::map<std::string, std::shared_ptr<const ResourceType>> types_;  // "group/version/plural"
  // Objects by type ("group/plural") then "namespace/name".
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;
  // What the garbage collector can act on, by type then key, in objects_'s order: objects with
  // ownerReferences, and objects being deleted that hold the orphan or foregroundDeletion
  // finalizer. A collection visits these alone, so a write on a server of 100,000 pods owned
  // by nothing does not walk them all under the lock (a real API server's delete never waits
  // for its collector either). An entry whose object went without RemoveLocked (its CRD's
  // store dropped whole) is dropped by the next collection.
  std::set<std::pair<std::string, std::string>> collectable_;
  std::deque<std::shared_ptr<const Event>> history_;
  std::vector<Fault> faults_;
  std::chrono::milliseconds requestDelay_{0};
  std::vector<LoggedRequest> log_;
  std::set<std::string> acceptedTokens_;
  std::map<std::string, UserInfo> users_;
  std::map<std::string, std::pair<std::string, int>> serviceEndpoints_;  // "ns/name" -> host, port
  std::map<std::string, std::vector<int>> serviceEndpointSets_;  // "ns/name" -> ports in turn
  std::atomic<uint64_t> endpointTurn_{0};
  bool virtApiMutator_ = false;
  std::atomic<uint64_t> admissionUid_{0};
};

}  // namespace cozy::fake
