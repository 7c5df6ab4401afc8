// A small HTTP/1.1 server for probes, Prometheus and admission webhooks: GET and HEAD on fixed
// paths answered on the loop (/healthz, /readyz, /metrics), POST on fixed paths handed to a
// bounded pool of workers (the webhooks, which may wait), optionally over TLS. One thread runs
// one epoll loop over the listening socket and every connection, with hard limits on
// connections, bytes and time, so that whoever reaches the port can neither exhaust the pod's
// memory nor keep a probe or a review from being answered (the webhooks moved here from
// cpp-httplib, which could be starved while readiness said ok). Room is made by who a connection
// is and what it is doing, never by age alone: a flood of silent connections from other
// addresses cannot push out a request being answered or an authenticated caller (H10).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace cozy::runtime {

struct HttpLimits {
  // Open connections. A new one beyond this closes one that may go, in this order: one
  // lingering after its last answer; one that has sent nothing yet (its TLS handshake included);
  // one still sending its request; an authenticated one idle between requests, only when the new
  // one comes from its own address; an unauthenticated one whose answer is being written (a
  // client that does not read it). Within a rank, the address holding the most connections
  // loses first, then the oldest. A connection whose request a worker is answering, and one that
  // presented a verified client certificate (SecureSession::PeerVerified) and is not idle, never
  // goes for a newer one: with nothing that may go, the new one is closed at once ("turned
  // away") and Saturated() says so. The accept itself never waits.
  size_t maxConnections = 64;
  // Connections one peer address may hold that are not authenticated (no verified client
  // certificate), TLS handshakes included: a new one beyond this closes that address's own
  // oldest such connection that is not being answered (else the new one), never another
  // address's. 0: no cap.
  size_t maxConnectionsPerPeer = 0;
  // A TLS handshake must be done within this from accept (0: within headerDeadline).
  std::chrono::milliseconds handshakeDeadline{0};
  // The whole request (head and any body) must arrive within this from accept (a later request
  // on a kept connection: from its first byte), however it trickles; then the connection is
  // closed (with 408 when part of a request had arrived).
  std::chrono::milliseconds headerDeadline{2000};
  // Request line and headers, up to and including the empty line: 431 beyond (414 when the
  // request line alone does not end within it).
  size_t maxHeaderBytes = 8192;
  // A Content-Length above this, or a chunked body that grows past it: 413 at once, without
  // reading the rest.
  size_t maxBodyBytes = 4096;
  // The answer must have been taken by the client within this from when it was ready; a client
  // that does not read is closed then.
  std::chrono::milliseconds writeDeadline{5000};

  // POST routes (HandlePost). Their handlers run on this many threads, so a handler that
  // waits holds a worker, never the loop.
  size_t workers = 16;
  // Complete requests waiting for a worker; one more is answered 503 at once: the queue never
  // grows without bound, and the caller learns at once that this replica is full.
  size_t queuedRequests = 64;
  // Request bodies held at once, while they arrive and until their handler returns. A body
  // that would go past it is refused (503) before it is read, so concurrent large bodies
  // cannot add up past the pod's memory limit.
  size_t maxBufferedBodyBytes = size_t{16} << 20;
  // From the request's start (HttpRequest::accepted): a POST handler's answer later than this
  // is not sent (the connection is closed then, and the answer dropped when it comes).
  std::chrono::milliseconds handlerDeadline{35000};

  // Keep-alive: requests one connection may carry. 1 (the default): every answer says
  // `Connection: close`. Above 1, an HTTP/1.1 request that does not ask to close gets its answer
  // on a connection kept open for the next request, until the last allowed one (whose answer says
  // `Connection: close`). A refusal by the server itself (400, 413, 503, ...), an HTTP/1.0
  // request, or bytes sent after a request before its answer (pipelining) close it.
  size_t requestsPerConnection = 1;
  // A kept connection whose next request has not begun within this is closed silently. Longer
  // than a client's own idle timeout (Go's 90 s), so that the client closes first and never sends
  // a request on a connection the server is closing.
  std::chrono::milliseconds keepAliveIdle{120000};
  // How long readiness (Saturated()) keeps saying so after a caller was refused 503 or turned
  // away: long enough for a probe every few seconds to see it.
  std::chrono::milliseconds refusingWindow{5000};
};

// A POST request as its handler sees it.
struct HttpRequest {
  std::string path;
  std::string query;  // the target after '?', as sent
  std::string body;
  // When the request began: the connection's accept for its first request, its first byte for
  // a later one on a kept connection. Deadlines that the caller set for the whole exchange (an
  // API server's webhook timeout) count from here, not from when a worker got to it.
  std::chrono::steady_clock::time_point accepted;

  // The raw value of the first `name=value` in the query ("" when absent). Not
  // percent-decoded: the parameters read this way are plain tokens ("timeout=10s").
  std::string QueryParameter(std::string_view name) const;
};

// A secured byte stream over one accepted, non-blocking socket (TLS). The loop drives it:
// every call returns at once.
class SecureSession {
 public:
  enum class Io { done, wantRead, wantWrite, closed, failed };
  virtual ~SecureSession() = default;
  virtual Io Handshake() = 0;
  // done with `count` > 0 bytes, or what it waits for (closed: the peer ended the stream).
  virtual Io Read(char* buffer, size_t size, size_t& count) = 0;
  // done with `count` > 0 bytes written; after wantRead/wantWrite, call again with the same
  // bytes.
  virtual Io Write(const char* data, size_t size, size_t& count) = 0;
  // Best effort, never waits: tells the peer the stream ends (TLS close_notify).
  virtual void Shutdown() = 0;
  // Why the handshake or the stream failed, for the log.
  virtual std::string Error() = 0;
  // After the handshake: whether the peer presented a certificate the transport verified
  // (a caller authenticated before it sent a byte of a request).
  virtual bool PeerVerified() { return false; }
  // Whether any byte came from the peer yet (a ClientHello): a connection that has sent
  // nothing is the first to go when the connections are all taken.
  virtual bool ReceivedAny() { return true; }
};

// Makes a session for each accepted socket (runtime/tls.h has the TLS one).
class SecureTransport {
 public:
  virtual ~SecureTransport() = default;
  // nullptr when no session can be made now (the connection is then closed).
  virtual std::unique_ptr<SecureSession> Accept(int fd) = 0;
};

struct HttpResponse {
  int status = 200;
  std::string contentType = "text/plain; charset=utf-8";
  std::string body;
};

// Every answer carries Content-Length; by default it also says `Connection: close` (one request
// per connection; HttpLimits::requestsPerConnection keeps connections alive). Not copyable;
// Start and Stop from one thread.
class HttpServer {
 public:
  // Called on the server's thread; must be quick (read a snapshot under a mutex). An exception
  // it throws becomes a 500.
  using Handler = std::function<HttpResponse()>;
  // Called on a worker thread; may wait (bounded by the caller's deadline). An exception it
  // throws becomes a 500.
  using PostHandler = std::function<HttpResponse(const HttpRequest&)>;

  explicit HttpServer(HttpLimits limits = {});
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before Start (ignored while serving). GET and HEAD only; HEAD gets the same headers, no body.
  void Handle(std::string path, Handler handler);
  // Before Start (ignored while serving). POST with a body of at most maxBodyBytes (413 beyond,
  // before it is read), answered by `handler` on the worker pool.
  void HandlePost(std::string path, PostHandler handler, size_t maxBodyBytes);
  // Before Start: serve through `transport` (TLS) instead of plain TCP. The handshake counts
  // against the request deadline from accept like the request itself.
  void UseTransport(std::shared_ptr<SecureTransport> transport);

  // "host:port", "[v6]:port", ":port" (all IPv4 addresses; "[::]:port" for IPv6 as well) or
  // "off" (serves nothing, returns true). False with error() when it cannot listen or the
  // address is malformed. Port 0 picks a free port: port().
  bool Start(const std::string& address);
  // Any thread: the first step of a graceful stop (docs/health-server.md, "Stopping without
  // dropping a request"). Every answer from now on says `Connection: close` and ends its connection
  // once written, so a caller's kept connections end one by one after an answer it has read, never
  // under a request it is sending; the server goes on accepting (a Service may still send new
  // connections here until its endpoints follow readiness).
  void Drain();
  // Stops serving and joins. With a `grace`: the listening socket closes first (a new connect is
  // refused, so a balancer sends it elsewhere), kept connections idle between requests close, and
  // every request already begun (a connection accepted but not yet sent on included) is read,
  // handled and its answer written (with `Connection: close`) for up to `grace`; then whatever is
  // left closes. Without one, every connection closes at once, whatever clients do.
  void Stop(std::chrono::milliseconds grace = {});
  // Stop's first half, on any one thread while others still call stats() and Saturated(): the
  // server's thread stops as Stop says and is joined; what the server holds (its workers, its
  // descriptors) goes with the Stop that follows. Once; later calls do nothing.
  void StopServing(std::chrono::milliseconds grace = {});
  int port() const { return port_; }
  const std::string& error() const { return error_; }
  // Before Start: runs on the server's thread as a graceful stop begins, before it closes the
  // kept connections idle between requests (tests: what a client sends at that very moment).
  void SetStopObserver(std::function<void()> observer) {
    shutdown_.beginning = std::move(observer);
  }

  struct Stats {
    int64_t requests;               // answered with a handler's response or 404
    int64_t rejected;               // refused by the server: 400, 405, 413, 414, 431, 501, 505
    int64_t timedOut;               // closed at the request, handler or write deadline
    int64_t overflowed;             // closed to make room for a newer connection (maxConnections)
    int64_t accepted;               // connections accepted
    int64_t busy = 0;               // 503: the worker queue or the body budget was full
    int64_t handshakeFailures = 0;  // TLS handshakes refused or broken
    int64_t active = 0;             // POST handlers running now
    int64_t queued = 0;             // complete POST requests waiting for a worker now
    int64_t peerCapped = 0;         // closed because their address held maxConnectionsPerPeer
    int64_t turnedAway = 0;  // new connections closed at once: every slot held by one that stays
    int64_t reused = 0;      // requests that came on a kept connection (keep-alive)
    int64_t open = 0;        // connections open now
  };
  Stats stats() const;
  // Whether callers are being refused, so that readiness sends them to another replica: a POST
  // arriving now would wait behind a full pool (every worker busy and the queue at least half
  // full), or within the last HttpLimits::refusingWindow a request was answered 503 for a full pool
  // or body budget or a connection was turned away. Connections closed to make room for others
  // (overflowed, peerCapped) do not count: they are how a flood of silent connections is
  // withstood, and a flood must not be able to take every replica out of a Service.
  bool Saturated() const;

  struct Route {
    Handler get;
    PostHandler post;
    size_t maxBodyBytes = 0;  // POST
  };
  class Workers;  // the POST handlers' threads and their bounded queue

 private:
  class Loop;  // the server thread's state: connections and their deadlines
  struct Counters {
    std::atomic<int64_t> requests{0};
    std::atomic<int64_t> rejected{0};
    std::atomic<int64_t> timedOut{0};
    std::atomic<int64_t> overflowed{0};
    std::atomic<int64_t> accepted{0};
    std::atomic<int64_t> busy{0};
    std::atomic<int64_t> handshakeFailures{0};
    std::atomic<int64_t> peerCapped{0};
    std::atomic<int64_t> turnedAway{0};
    std::atomic<int64_t> reused{0};
    std::atomic<int64_t> open{0};
    // steady_clock nanoseconds of the last 503 or turned-away connection; INT64_MIN: none.
    std::atomic<int64_t> lastRefusal{INT64_MIN};
  };

  // What Drain and Stop tell the server's thread.
  struct Shutdown {
    std::atomic<bool> draining{false};
    std::atomic<int64_t> graceMilliseconds{0};  // read when the thread is woken to stop
    std::atomic<bool> listenerClosed{false};    // the thread closed the listening socket
    std::function<void()> beginning;            // SetStopObserver's; set before Start
  };

  bool Listen(const std::string& address, const std::string& host, int port);
  void CloseDescriptors();

  HttpLimits limits_;
  std::map<std::string, Route, std::less<>> routes_;
  std::shared_ptr<SecureTransport> transport_;
  std::unique_ptr<Workers> workers_;
  Counters counters_;
  Shutdown shutdown_;
  int listenFd_ = -1;
  int wakeFd_ = -1;
  int epollFd_ = -1;
  int port_ = 0;
  std::string error_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

// "host:port" / "[::1]:port" / ":port" -> (host, port); ("", -1) on a malformed address
// (an unbracketed IPv6 literal is ambiguous, so malformed); host "0.0.0.0" for ":port".
std::pair<std::string, int> ParseListenAddress(const std::string& address);

}  // namespace cozy::runtime
