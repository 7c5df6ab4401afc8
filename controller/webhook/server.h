// The admission webhooks' HTTPS server (issue 15, G2): AdmissionReview v1 POSTs on fixed paths,
// served on every replica, only with --enable-gpu.
//
// The serving certificate and key are read from `tls.crt` and `tls.key` in a directory, as
// cert-manager and kubelet mount a Secret. They are looked at again on every TLS handshake (a
// stat of each file, following kubelet's `..data` symlink swap) and re-read when either
// changed, so a renewed certificate is served from the next connection on, without a restart.
// A pair that does not load (a half-written file, a key that does not match) is logged and
// the last good pair stays in use.
//
// Callers (issue 23): with `clientCaFile` set, only a client presenting a certificate that CA
// signed completes the TLS handshake: the API server, when its admission configuration gives it
// a kubeconfig for webhooks (docs/install.md, "Who may call the webhooks"). Anyone else is
// refused before a byte of the request is read. The CA file is looked at again on every
// handshake and re-read when it changed, like the serving pair; one that does not load is
// logged and the last good one stays.
//
// Threads: cpp-httplib's pool (`threads`), one connection per thread. A handler that waits for
// the binder holds its thread for seconds, so at most `maxWaiting` requests may wait at once
// (WaitSlot): the rest of the pool always answers the others.
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
#include <thread>

#include <nlohmann/json.hpp>

namespace httplib {
class SSLServer;
}

namespace cozy::controller::webhook {

struct ServerOptions {
  std::string address = ":9443";       // "host:port" or ":port" (every IPv4 address)
  std::filesystem::path certDir;       // holds tls.crt (the chain) and tls.key
  std::filesystem::path clientCaFile;  // PEM CA bundle callers' certificates must chain to; empty:
                                       // any TLS client (docs/security.md says what that costs)
  size_t threads = 64;
  size_t maxWaiting = 40;
  // The webhooks see CREATEs only: one object, at most etcd's 1.5 MiB, in a review. A bigger
  // body is refused (413) before it is parsed; one nesting deeper than kube::kMaxJsonDepth is
  // refused (400) without recursing into it.
  size_t maxBodyBytes = size_t{3} << 20;
  std::chrono::seconds readTimeout{10};
};

// What a handler gets besides the review: when the API server stops waiting for the answer
// (from the `timeout` query parameter it sends, less a margin for the way back).
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
  // thread of its own. Throws when the address cannot be bound.
  void Start();
  void Stop();
  int port() const { return port_; }
  bool serving() const { return serving_.load(); }

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
  };
  Stats stats() const;

  // The certificate pair as the next handshake serves it (reloaded when the files changed).
  class Certificates;
  // The callers' CA as the next handshake verifies against (reloaded when the file changed).
  class ClientAuthority;
  struct Tls;

 private:
  ServerOptions options_;
  std::map<std::string, Handler> handlers_;
  std::unique_ptr<Certificates> certificates_;
  std::unique_ptr<ClientAuthority> clientAuthority_;
  std::unique_ptr<Tls> tls_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> serving_{false};
  std::atomic<size_t> waiting_{0};
  mutable std::mutex statsMutex_;
  Stats stats_;
};

// The API server's `timeout` query parameter ("10s", "30s"); the default is its own (10 s).
std::chrono::milliseconds RequestTimeout(const std::string& parameter);

}  // namespace cozy::controller::webhook
