// A small Kubernetes REST client over libcurl: JSON in and out, typed errors, retries with
// backoff and jitter (honouring Retry-After), a token-bucket rate limit, bearer tokens that
// rotate, and watches that an event loop can drive (see watch.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/backoff.h"
#include "kube/clock.h"
#include "kube/config.h"
#include "kube/errors.h"
#include "kube/json_stream.h"
#include "kube/token_source.h"

struct curl_slist;  // libcurl's, kept out of this header

namespace cozy::kube {

class WatchStream;

struct ClientOptions {
  TimeSource* time = nullptr;  // nullptr: the system clock
  RandomSource random;         // empty: a seeded generator
  // Retries inside one call, for connection errors, 429 and 5xx. A caller that runs its own
  // schedule (the publisher, the informer) sets 0 so that no call sleeps in its loop.
  int maxRetries = 3;
  BackoffPolicy retryBackoff{std::chrono::milliseconds(200), std::chrono::seconds(10), 2.0, 1.0};
  // A Retry-After longer than this is not slept in-call: the error goes to the caller.
  Duration maxRetryAfter = std::chrono::seconds(30);
  double qps = 5.0;  // client-go's defaults; qps <= 0 turns the limit off
  int burst = 10;
  Duration connectTimeout = std::chrono::seconds(5);
  Duration requestTimeout = std::chrono::seconds(30);  // not for watches
  std::string userAgent = "cozy-gpu";
  // Longest response body taken: a longer one (announced by Content-Length, or counted as it
  // arrives) fails that request with kBadResponse, the transfer aborted at the cap.
  size_t maxResponseBytes = kDefaultMaxJsonBytes;
  // Longest single watch event (one JSON value of the stream, client-go's 16 MiB): a longer
  // one ends that watch with kBadResponse.
  size_t maxWatchEventBytes = kDefaultMaxJsonBytes;
};

// Sets the client-side rate limit from a daemon's flags (`--qps`, `--burst`): qps 0 turns
// the limit off. Throws std::invalid_argument, naming the flag, for a negative or non-finite
// qps or a burst below 1.
void SetRateLimit(ClientOptions& options, double qps, int burst);

using Query = std::vector<std::pair<std::string, std::string>>;

struct ListOptions {
  std::string labelSelector;
  std::string fieldSelector;
  std::string resourceVersion;  // "" = consistent read of the latest state
  int limit = 0;                // > 0: pages of this size, followed through `continue`
  // A page over ClientOptions::maxResponseBytes is asked for again with half the limit (down
  // to 1); each time, this is told the limit before and after (ListPages).
  std::function<void(int from, int to)> onPageHalved;
};

struct WatchOptions {
  std::string labelSelector;
  std::string fieldSelector;
  std::string resourceVersion;  // "" = current state as ADDED events first
  bool allowWatchBookmarks = true;
  int timeoutSeconds = 0;  // 0: the server's default
  // Events of objects without a key `skim` wants come as stubs of their metadata, marked
  // skimmed, without a JSON document built (SkimEvent). Empty: every event whole.
  SkimWants skim{};
};

// The instant by which a call must be over, asked again before each of its attempts (the first
// and every retry); std::nullopt: no attempt may start now. On the client's TimeSource (the
// steady clock by default, as LeaderElector::LeadingUntil).
using DeadlineSource = std::function<std::optional<TimePoint>()>;

// Limits on one call beyond ClientOptions' (what client-go's per-call context carries).
struct RequestOptions {
  // Empty: ClientOptions' timeout and retries alone. Otherwise asked before every attempt: an
  // attempt starts only while the instant is at least 1 ms ahead (else the call throws
  // kDeadlineExceeded, nothing sent), its timeout is cut to end at the instant, and a retry
  // whose wait (backoff or Retry-After) would reach the instant is not made (the last error
  // goes to the caller). A leader's writes pass their lease's (LeaderDeadline).
  DeadlineSource deadline;
};

// Options of every write (client-go's CreateOptions / UpdateOptions / PatchOptions): sent as
// the query parameters `dryRun=All` and `fieldManager=...`.
struct WriteOptions {
  bool dryRun = false;       // dryRun=All: validated and admitted, never stored
  std::string fieldManager;  // who owns the fields written (server-side field management)
  // Not sent: bounds the call's attempts.
  RequestOptions request = {};
};

// DeleteOptions, sent as the request's body (kind DeleteOptions, apiVersion v1) as client-go
// does; dryRun also in the query. The API has no fieldManager for deletes.
struct DeleteOptions {
  bool dryRun = false;
  std::string preconditionUid;              // delete only the object with this uid
  std::string preconditionResourceVersion;  // ... and only at this resourceVersion (409 else)
  std::string propagationPolicy;            // "Orphan", "Background", "Foreground" or ""
  std::optional<int64_t> gracePeriodSeconds;
  // Not sent: bounds the call's attempts.
  RequestOptions request = {};
};

// The DeleteOptions body Delete sends; null when every option is at its default.
nlohmann::json DeleteOptionsBody(const DeleteOptions& options);

// "/api/v1/nodes/n1", "/apis/gpu.cozystack.io/v1alpha1/gpunodes/n1/status", ...
std::string ResourcePath(std::string_view group, std::string_view version, std::string_view plural,
                         std::string_view ns = "", std::string_view name = "",
                         std::string_view subresource = "");

// Percent-encodes a query value (selectors carry '=', ',', '!', '(' ...).
std::string EncodeQueryValue(std::string_view value);

class Client {
 public:
  explicit Client(ClientConfig config, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Every call throws ApiError on failure (after the retries allowed), naming method and path;
  // nothing else (a 2xx body that is not JSON or is over the cap is kBadResponse).
  nlohmann::json Get(const std::string& path, const Query& query = {});
  nlohmann::json Create(const std::string& collectionPath, const nlohmann::json& object,
                        const WriteOptions& options = {});
  // PUT: conditional on the object's metadata.resourceVersion (409 kConflict when stale).
  nlohmann::json Update(const std::string& path, const nlohmann::json& object,
                        const WriteOptions& options = {});
  nlohmann::json MergePatch(const std::string& path, const nlohmann::json& patch,
                            const WriteOptions& options = {});
  // A merge patch that applies only at `resourceVersion`: the patch carries it as
  // metadata.resourceVersion, which the server compares (409 kConflict when stale).
  nlohmann::json MergePatchAt(const std::string& path, nlohmann::json patch,
                              const std::string& resourceVersion, const WriteOptions& options = {});
  nlohmann::json JsonPatch(const std::string& path, const nlohmann::json& operations,
                           const WriteOptions& options = {});
  nlohmann::json Delete(const std::string& path, const DeleteOptions& options = {});
  // A whole list (pages joined); `metadata.resourceVersion` is the list's. Checked for the
  // shape every Kubernetes list has, so callers can read it without type surprises: an
  // object with a metadata object whose resourceVersion is a string, `items` an array of
  // objects (null or absent reads as empty) whose metadata, where present, is an object with
  // string name, namespace and resourceVersion. Anything else is kBadResponse naming the
  // field ("items is a string, not an array", "items[3].metadata.resourceVersion is a
  // number, not a string").
  nlohmann::json List(const std::string& collectionPath, const ListOptions& options = {});
  // The same list a page at a time: `onPage` gets each checked page (it may take its items),
  // and the next is asked for only after it returned, so a caller that keeps little of each
  // page never holds the whole list. Returns the list's metadata (its resourceVersion). A
  // failure on a later page throws after earlier pages were handed over.
  nlohmann::json ListPages(const std::string& collectionPath, const ListOptions& options,
                           const std::function<void(nlohmann::json& page)>& onPage);
  // Opens a watch; it is driven by its owner (see WatchStream).
  std::unique_ptr<WatchStream> Watch(const std::string& collectionPath,
                                     const WatchOptions& options);

  // One request: method, path, query, optional body with its Content-Type; its attempts
  // bounded by `request` (RequestOptions).
  nlohmann::json Request(const std::string& method, const std::string& path, const Query& query,
                         const std::string* body = nullptr, const std::string& contentType = "",
                         const RequestOptions& request = {});

  const ClientConfig& config() const { return config_; }
  const ClientOptions& options() const { return options_; }
  // Changes ClientOptions::requestTimeout for the requests that follow; only for a client
  // that one thread uses (the leader elector bounds each request by its renew deadline).
  void SetRequestTimeout(Duration timeout) { options_.requestTimeout = timeout; }
  TimeSource& time() { return *time_; }
  TokenSource& tokens() { return tokens_; }
  RateLimiter& rateLimiter() { return limiter_; }

  // Internal to the library (watch.cpp): a handle with the TLS and auth settings applied.
  void* NewConfiguredHandle(const std::string& url, curl_slist** headers,
                            const std::string& accept);

 private:
  struct RawResponse;
  RawResponse PerformOnce(const std::string& method, const std::string& url,
                          const std::string* body, const std::string& contentType,
                          Duration timeout);
  void* TakeHandle();
  void ReturnHandle(void* handle);

  ClientConfig config_;
  ClientOptions options_;
  TimeSource* time_;
  TokenSource tokens_;
  RateLimiter limiter_;
  std::mutex handlesMutex_;
  std::vector<void*> idleHandles_;  // CURL*, kept for keep-alive connection reuse
};

}  // namespace cozy::kube
