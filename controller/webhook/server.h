// The admission webhooks' HTTPS server (G2; docs/controller.md, "Admission webhooks"):
// AdmissionReview v1 POSTs on fixed paths, served on every replica, only with --enable-gpu.
//
// Served on runtime::HttpServer: one epoll loop reads every request whole within a deadline
// from its start (the TLS handshake within a shorter one) with caps on header and body bytes,
// on connections and on what one address may hold before it authenticates, and hands complete
// reviews to a bounded pool of workers; a review arriving when the queue is full is answered
// 503 at once, and readiness reports a saturated pool or callers turned away (Saturated()), so
// the Service sends the API server to another replica. Connections are kept alive for the API
// server's next review; a flood of silent connections never closes an authenticated one or a
// review being answered (H10, docs/security.md). TLS, the certificate reload and the callers'
// CA are runtime::TlsTransport's (runtime/tls.h).
//
// Callers (H9): with `clientCaFile` set, only a client presenting a certificate that CA
// signed completes the TLS handshake: the API server, when its admission configuration gives it
// a kubeconfig for webhooks (docs/install.md, "Who may call the webhooks"). Anyone else is
// refused before a byte of the request is read.
//
// A handler that waits for the binder holds its worker for seconds, so at most `maxWaiting`
// requests may wait at once (WaitSlot): the other workers always answer the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/http_server.h"
#include "runtime/tls.h"

namespace cozy::controller::webhook {

struct ServerOptions {
  // "host:port", "[v6]:port" or ":port" (every IPv4 address; "[::]:port" for IPv6 as well).
  std::string address = ":9443";
  std::filesystem::path certDir;       // holds tls.crt (the chain) and tls.key
  std::filesystem::path clientCaFile;  // PEM CA bundle callers' certificates must chain to; empty:
                                       // any TLS client (docs/security.md says what that costs)
  size_t threads = 32;                 // workers running handlers
  size_t maxWaiting = 24;              // of them, how many may wait for the binder at once
  size_t queue = 64;                   // complete reviews waiting for a worker; more: 503 at once
  size_t maxConnections = 128;
  // Connections one address may hold before it authenticates (its TLS handshake included):
  // beyond, that address's own oldest one goes, never another's. An authenticated caller's
  // connections do not count; without a client CA every connection counts, the API server's too.
  size_t maxConnectionsPerPeer = 32;
  // From accept: the TLS handshake must be done within this. The API server sends its
  // ClientHello with the connect, so a connection that has not finished by then is a stalled
  // or hostile one, and it holds its slot no longer.
  std::chrono::milliseconds handshakeDeadline{3000};
  // Keep-alive: reviews one connection may carry, and how long a kept connection may wait for
  // the next (longer than the API server's own 90 s, so that it closes first). An
  // authenticated caller's kept connection is never closed for another address's new one.
  size_t requestsPerConnection = 1000;
  std::chrono::milliseconds keepAliveIdle{120000};
  // The webhooks see CREATEs only: one object, at most etcd's 1.5 MiB, in a review. A bigger
  // body is refused (413) before it is read; one nesting deeper than kube::kMaxJsonDepth is
  // refused (400) without recursing into it.
  size_t maxBodyBytes = size_t{3} << 20;
  // Bodies held at once (arriving, queued, being handled): a review past it is refused (503)
  // before it is read. Parsed, a review takes up to about 20 times its bytes.
  size_t maxBufferedBodyBytes = size_t{12} << 20;
  // From accept: the TLS handshake and the whole request must arrive within this.
  std::chrono::milliseconds requestDeadline{10000};
  // From accept: an answer later than this is not sent (the API server waits 30 s at most).
  std::chrono::milliseconds answerDeadline{32000};
};

// What a handler gets besides the review: when the API server stops waiting for the answer
// (from the `timeout` query parameter it sends, counted from when the connection was accepted,
// less a margin for the way back).
struct RequestContext {
  std::chrono::steady_clock::time_point deadline;
};

class Server {
 public:
  // The review as sent; returns the AdmissionReview to answer. An exception becomes a 500
  // naming the path, which the API server reads as a failed call (failurePolicy Fail: denied).
  using Handler =
      std::function<nlohmann::json(const nlohmann::json& review, const RequestContext&)>;

  explicit Server(ServerOptions options);
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void Handle(const std::string& path, Handler handler);  // before Start
  // Loads the certificate (throws naming the file and what is wrong), binds and serves on a
  // thread of its own. Throws when the address is malformed or cannot be bound, saying why.
  void Start();
  // Any thread, as the replica begins to stop: answers from now on close their connections
  // (runtime::HttpServer::Drain), so the API server's kept connections move to another replica
  // one by one, each after an answer it has read.
  void Drain();
  // No new connections; the reviews begun are answered within `grace`
  // (runtime::HttpServer::StopServing), while the replica's loop still serves their waits. Any one
  // thread; stats() and Saturated() may be called meanwhile.
  void StopServing(std::chrono::milliseconds grace);
  void Stop();
  int port() const { return port_; }
  bool serving() const { return serving_.load(); }
  // Every worker busy and reviews queued: readiness says so (a Service then sends callers to
  // another replica).
  bool Saturated() const;

  // A slot for a request that may wait: nullopt when maxWaiting already wait.
  class WaitSlot {
   public:
    explicit WaitSlot(std::atomic<size_t>& count) : count_(&count) {}
    WaitSlot(WaitSlot&& other) noexcept : count_(other.count_) { other.count_ = nullptr; }
    WaitSlot(const WaitSlot&) = delete;
    WaitSlot& operator=(const WaitSlot&) = delete;
    WaitSlot& operator=(WaitSlot&&) = delete;
    ~WaitSlot() {
      if (count_) --*count_;
    }

   private:
    std::atomic<size_t>* count_;
  };
  std::optional<WaitSlot> TryWait();

  struct Stats {
    int64_t requests = 0;
    int64_t failures = 0;  // answered 4xx/5xx (a bad review, a handler's exception)
    int64_t certificateLoads = 0;
    int64_t certificateErrors = 0;
    int64_t certificateNotAfter = 0;  // the served certificate's expiry, Unix seconds
    std::map<std::string, int64_t> byPath;
    runtime::HttpServer::Stats http{};  // the connections': refusals, time-outs, the pool
  };
  Stats stats() const;

 private:
  ServerOptions options_;
  std::map<std::string, Handler> handlers_;
  std::shared_ptr<runtime::TlsTransport> tls_;
  std::unique_ptr<runtime::HttpServer> server_;
  int port_ = 0;
  std::atomic<bool> serving_{false};
  std::atomic<size_t> waiting_{0};
  mutable std::mutex statsMutex_;
  Stats stats_;
};

// The API server's `timeout` query parameter ("10s", "30s"); the default is its own (10 s).
std::chrono::milliseconds RequestTimeout(const std::string& parameter);

}  // namespace cozy::controller::webhook
