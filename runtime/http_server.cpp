#include "runtime/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <mutex>
#include <optional>
#include <string_view>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/worker_pool.h"

namespace cozy::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// After the answer: how long, and how many bytes, the server keeps reading and dropping what
// the client still sends (a refused body, say) before it closes. Closing a socket with unread
// bytes sends a reset, which can destroy the answer before the client has read it.
constexpr std::chrono::milliseconds kLingerTime{500};
constexpr size_t kLingerBytes = 64 * 1024;
// accept() out of descriptors (EMFILE and the like): the listening socket stays readable, so
// stop watching it for this long instead of spinning.
constexpr std::chrono::milliseconds kAcceptPause{100};
// Connections accepted per wake-up before the loop serves the others' events. A probe's
// request is answered as it is accepted, and the client's close of an answered connection is
// only seen between bursts, so a long burst would fill the slots with such connections.
constexpr int kAcceptBurst = 16;
// Deep enough that a burst of connects (a flood among them) does not drop a caller's SYN,
// which would cost it a second's retransmission; the kernel caps it at net.core.somaxconn.
constexpr int kListenBacklog = 4096;
// A chunk-size line or trailer line longer than this is not a probe's.
constexpr size_t kMaxChunkLine = 1024;

std::string ErrnoText(int error) { return std::system_category().message(error); }

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "";
  }
}

// RFC 9110 tchar: the characters of a method or a header name.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
    return true;
  }
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), IsTokenChar);
}

// Field values: visible characters, obs-text, space and tab; never CR, LF, NUL or other controls.
bool IsFieldValue(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte == '\t' || (byte >= 0x20 && byte != 0x7f);
  });
}

std::string_view TrimWhitespace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           const auto lower = [](char c) {
             return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
           };
           return lower(x) == lower(y);
         });
}

// Decimal digits only (no sign, no space); nullopt when it is not that, UINT64_MAX when it
// overflows (which is over any cap anyway).
std::optional<uint64_t> ParseDecimal(std::string_view text) {
  if (text.empty()) {
    return std::nullopt;
  }
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') {
      return std::nullopt;
    }
    const auto digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) {
      value = UINT64_MAX;
    } else {
      value = value * 10 + digit;
    }
  }
  return value;
}

struct RequestLine {
  int status = 0;  // 0: served; else the refusal
  bool headOnly = false;
  bool post = false;
  int minorVersion = 1;
  std::string path;
  std::string query;
};

// "METHOD SP target SP HTTP/1.x", exactly (RFC 9112 §3). The method is judged only once the
// line is well formed, so garbage is a 400 and a well-formed PUT a 405 (POST is judged against
// the path's route by the caller).
RequestLine ParseRequestLine(std::string_view line) {
  RequestLine result;
  const size_t firstSpace = line.find(' ');
  const size_t lastSpace = line.rfind(' ');
  if (firstSpace == std::string_view::npos || firstSpace == lastSpace) {
    result.status = 400;
    return result;
  }
  const std::string_view method = line.substr(0, firstSpace);
  const std::string_view target = line.substr(firstSpace + 1, lastSpace - firstSpace - 1);
  const std::string_view version = line.substr(lastSpace + 1);
  const bool targetVisible = std::all_of(target.begin(), target.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte > 0x20 && byte < 0x7f;
  });
  const bool versionShaped = version.size() == 8 && version.substr(0, 5) == "HTTP/" &&
                             version[5] >= '0' && version[5] <= '9' && version[6] == '.' &&
                             version[7] >= '0' && version[7] <= '9';
  if (!IsToken(method) || target.empty() || !targetVisible || !versionShaped) {
    result.status = 400;
    return result;
  }
  if (version[5] != '1') {
    result.status = 505;
    return result;
  }
  result.minorVersion = version[7] - '0';
  if (method != "GET" && method != "HEAD" && method != "POST") {
    result.status = 405;
    return result;
  }
  result.headOnly = method == "HEAD";
  result.post = method == "POST";
  // origin-form "/path?query", or absolute-form "http://authority/path?query" (RFC 9112 §3.2).
  std::string_view path = target;
  if (path.front() != '/') {
    const size_t scheme = path.find("://");
    if (scheme == std::string_view::npos || scheme == 0) {
      result.status = 400;
      return result;
    }
    const size_t slash = path.find('/', scheme + 3);
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
  }
  const size_t pathEnd = path.find_first_of("?#");
  if (pathEnd != std::string_view::npos && path[pathEnd] == '?') {
    const std::string_view query = path.substr(pathEnd + 1);
    result.query = std::string(query.substr(0, query.find('#')));
  }
  path = path.substr(0, pathEnd);
  result.path = std::string(path.empty() ? "/" : path);
  return result;
}

// What the header lines say about framing and Host, checked once the head is complete.
struct HeaderSummary {
  int hosts = 0;
  int contentLengths = 0;
  std::optional<uint64_t> contentLength;
  int transferEncodings = 0;
  std::string_view transferEncoding;  // the last one; several at all is refused below
  bool close = false;                 // a Connection header naming `close`

  // One field line (without its line end). 0, or the status refusing it.
  int Add(std::string_view line) {
    if (line.front() == ' ' || line.front() == '\t') {
      return 400;  // obs-fold, which RFC 9112 §5.2 lets a server refuse
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return 400;
    }
    const std::string_view name = line.substr(0, colon);  // "Host : x" fails here: no space
    const std::string_view value = TrimWhitespace(line.substr(colon + 1));
    if (!IsToken(name) || !IsFieldValue(value)) {
      return 400;
    }
    if (EqualsIgnoreCase(name, "host")) {
      ++hosts;
    } else if (EqualsIgnoreCase(name, "content-length")) {
      ++contentLengths;
      contentLength = ParseDecimal(value);
      if (!contentLength) {
        return 400;
      }
    } else if (EqualsIgnoreCase(name, "transfer-encoding")) {
      ++transferEncodings;
      transferEncoding = value;
    } else if (EqualsIgnoreCase(name, "connection")) {
      std::string_view options = value;
      while (!options.empty()) {
        const size_t comma = options.find(',');
        if (EqualsIgnoreCase(TrimWhitespace(options.substr(0, comma)), "close")) close = true;
        options.remove_prefix(comma == std::string_view::npos ? options.size() : comma + 1);
      }
    }
    return 0;
  }
};

enum class BodyFraming { none, length, chunked };

// Reads a chunked body (RFC 9112 §7.1) only to find its end, counting its data against the cap;
// the data is dropped.
class ChunkedBody {
 public:
  enum class Result { needMore, done, malformed, tooLarge };

  explicit ChunkedBody(size_t maxBytes) : maxBytes_(maxBytes) {}

  // Consumes bytes up to the end of the body; what follows it is left alone (leftover() says
  // how much). The chunks' data is appended to `keep` when given, else dropped.
  Result Feed(std::string_view bytes, std::string* keep = nullptr) {
    while (!bytes.empty()) {
      if (state_ == State::data) {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(chunkLeft_, bytes.size()));
        if (keep != nullptr) keep->append(bytes.substr(0, take));
        chunkLeft_ -= take;
        bytes.remove_prefix(take);
        if (chunkLeft_ == 0) {
          state_ = State::dataEnd;
        }
        continue;
      }
      const size_t newline = bytes.find('\n');
      const std::string_view piece = bytes.substr(0, newline);
      if (line_.size() + piece.size() > kMaxChunkLine) {
        return Result::malformed;
      }
      line_.append(piece);
      if (newline == std::string_view::npos) {
        return Result::needMore;
      }
      bytes.remove_prefix(newline + 1);
      if (!line_.empty() && line_.back() == '\r') {
        line_.pop_back();
      }
      const Result result = Line(line_);
      line_.clear();
      if (result != Result::needMore) {
        leftover_ = bytes.size();
        return result;
      }
    }
    return Result::needMore;
  }

  // Bytes of the last Feed after the body's end.
  size_t leftover() const { return leftover_; }

 private:
  enum class State { size, data, dataEnd, trailer };

  Result Line(std::string_view line) {
    switch (state_) {
      case State::size: {
        size_t digits = 0;
        uint64_t size = 0;
        for (; digits < line.size(); ++digits) {
          const char c = line[digits];
          int value = -1;
          if (c >= '0' && c <= '9') value = c - '0';
          if (c >= 'a' && c <= 'f') value = c - 'a' + 10;
          if (c >= 'A' && c <= 'F') value = c - 'A' + 10;
          if (value < 0) break;
          if (size > (UINT64_MAX >> 4)) {
            return Result::tooLarge;
          }
          size = size * 16 + static_cast<uint64_t>(value);
        }
        const std::string_view rest = TrimWhitespace(line.substr(digits));
        if (digits == 0 || (!rest.empty() && rest.front() != ';') || !IsFieldValue(rest)) {
          return Result::malformed;
        }
        if (size > maxBytes_ - received_) {
          return Result::tooLarge;  // before reading any of it
        }
        received_ += static_cast<size_t>(size);
        chunkLeft_ = size;
        state_ = size == 0 ? State::trailer : State::data;
        return Result::needMore;
      }
      case State::dataEnd:
        if (!line.empty()) {
          return Result::malformed;
        }
        state_ = State::size;
        return Result::needMore;
      case State::trailer:
        if (line.empty()) {
          return Result::done;
        }
        trailerBytes_ += line.size();
        if (trailerBytes_ > kMaxChunkLine) {
          return Result::malformed;
        }
        return Result::needMore;
      case State::data:
        break;
    }
    return Result::malformed;
  }

  size_t maxBytes_;
  size_t leftover_ = 0;
  size_t received_ = 0;
  uint64_t chunkLeft_ = 0;
  size_t trailerBytes_ = 0;
  std::string line_;
  State state_ = State::size;
};

std::string FormatResponse(const HttpResponse& response, bool headOnly, std::string_view allow = {},
                           bool close = true) {
  std::string out;
  out.reserve(160 + (headOnly ? 0 : response.body.size()));
  out += "HTTP/1.1 ";
  out += std::to_string(response.status);
  out += ' ';
  out += ReasonPhrase(response.status);
  out += "\r\nContent-Type: ";
  out += response.contentType;
  out += "\r\nContent-Length: ";
  out += std::to_string(response.body.size());
  out += close ? "\r\nConnection: close\r\n" : "\r\nConnection: keep-alive\r\n";
  if (!allow.empty()) {
    out += "Allow: ";
    out += allow;
    out += "\r\n";
  }
  out += "\r\n";
  if (!headOnly) {
    out += response.body;
  }
  return out;
}

// The server's own answers: the status and its phrase as the body.
HttpResponse Refusal(int status) {
  HttpResponse response;
  response.status = status;
  response.body = std::string(ReasonPhrase(status)) + "\n";
  return response;
}

// Whether a handler's answer can be sent as it is.
bool Sendable(const HttpResponse& response) {
  const bool typeSafe =
      IsFieldValue(response.contentType) && !TrimWhitespace(response.contentType).empty();
  return response.status >= 200 && response.status <= 599 && typeSafe;
}

}  // namespace

std::string HttpRequest::QueryParameter(std::string_view name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const size_t equals = pair.find('=');
    if (pair.substr(0, equals) == name) {
      return equals == std::string_view::npos ? std::string()
                                              : std::string(pair.substr(equals + 1));
    }
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return {};
}

// POST handlers' threads: a runtime::WorkerPool of `threads` threads, all started with the
// server, with a queue of `capacity` requests (docs/health-server.md). The loop submits complete
// requests (refused when the queue is full) and collects answers through an eventfd; a job never
// touches a connection, only its id.
class HttpServer::Workers {
 public:
  struct Job {
    uint64_t id = 0;
    int fd = -1;
    const PostHandler* handler = nullptr;
    HttpRequest request;
    size_t reserved = 0;  // body bytes counted against maxBufferedBodyBytes until it is done
  };
  struct Done {
    uint64_t id = 0;
    int fd = -1;
    HttpResponse response;
    size_t reserved = 0;
  };

  Workers(size_t threads, size_t capacity)
      : threadCount_(std::max<size_t>(threads, 1)), pool_("http-worker", threadCount_, capacity) {}
  ~Workers() { Stop(); }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // False with `error` when the eventfd or a thread cannot be made.
  bool Start(std::string& error) {
    doneFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (doneFd_ < 0) {
      error = "eventfd: " + ErrnoText(errno);
      return false;
    }
    try {
      pool_.StartAll();
    } catch (const std::system_error& failed) {
      error = std::string("starting the worker threads: ") + failed.what();
      Stop();
      return false;
    }
    return true;
  }

  // Joins the threads after their current handlers return; queued requests are dropped.
  void Stop() {
    pool_.Stop();
    if (doneFd_ >= 0) {
      ::close(doneFd_);
      doneFd_ = -1;
    }
  }

  bool TrySubmit(Job&& job) {
    return pool_.TrySubmit([this, job = std::move(job)]() mutable { Handle(job); });
  }

  std::vector<Done> TakeDone() {
    uint64_t count = 0;
    (void)::read(doneFd_, &count, sizeof count);
    std::lock_guard lock(mutex_);
    return std::exchange(done_, {});
  }

  int doneFd() const { return doneFd_; }
  int64_t active() const { return static_cast<int64_t>(pool_.Running()); }
  int64_t queued() const { return static_cast<int64_t>(pool_.Queued()); }
  bool Saturated() const {
    return static_cast<size_t>(active()) >= threadCount_ &&
           static_cast<size_t>(queued()) >= std::max<size_t>(1, pool_.MaxQueued() / 2);
  }

 private:
  // A worker thread: runs the handler; its answer goes back through the eventfd.
  void Handle(Job& job) {
    Done done{job.id, job.fd, {}, job.reserved};
    try {
      done.response = (*job.handler)(job.request);
      if (!Sendable(done.response)) done.response = Refusal(500);
    } catch (...) {
      done.response = Refusal(500);  // a handler's bug must not take the daemon down
    }
    job.request = {};  // the body goes before the answer is handed over
    {
      std::lock_guard lock(mutex_);
      done_.push_back(std::move(done));
    }
    const uint64_t one = 1;
    (void)::write(doneFd_, &one, sizeof one);
  }

  const size_t threadCount_;
  int doneFd_ = -1;
  std::mutex mutex_;
  std::vector<Done> done_;
  runtime::WorkerPool pool_;  // last: joined before what its jobs use goes
};

// Runs on the server's thread; owns the connections. Every connection moves forward only:
// (TLS handshake,) reading its head, maybe reading a body (dropped, or kept for a POST
// route), being handled by a worker (POST), writing its answer, lingering, closed. Each phase
// has a deadline (the request's from accept, a handler's from accept, the answer's from when
// it was ready; lingering ends by the write deadline too), so nothing a client does or fails
// to do holds a slot for longer than those added up.
class HttpServer::Loop {
 public:
  Loop(const HttpLimits& limits, const std::map<std::string, Route, std::less<>>& routes,
       Counters& counters, Shutdown& shutdown, SecureTransport* transport, Workers* workers,
       int listenFd, int wakeFd, int epollFd)
      : limits_(limits),
        routes_(routes),
        counters_(counters),
        shutdown_(shutdown),
        transport_(transport),
        workers_(workers),
        listenFd_(listenFd),
        wakeFd_(wakeFd),
        epollFd_(epollFd) {
    limits_.maxConnections = std::max<size_t>(limits_.maxConnections, 1);
  }

  ~Loop() {
    for (auto& [fd, connection] : connections_) {
      ::close(fd);
    }
  }

  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  void Run() {
    std::array<epoll_event, 64> events{};
    const int doneFd = workers_ != nullptr ? workers_->doneFd() : -1;
    for (;;) {
      const int ready = epoll_wait(epollFd_, events.data(), static_cast<int>(events.size()),
                                   TimeoutMilliseconds());
      if (ready < 0 && errno != EINTR) {
        return;  // only with a broken epoll descriptor; Stop still joins
      }
      now_ = Clock::now();
      for (int i = 0; i < ready; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wakeFd_) {
          if (!BeginStop()) return;
          continue;
        }
        if (fd == listenFd_ && listenFd_ >= 0) {
          AcceptBurst();
        } else if (fd == doneFd) {
          TakeAnswers();
        } else if (const auto found = connections_.find(fd); found != connections_.end()) {
          // Whatever the event says: each phase tries its own I/O, which tells EOF, errors
          // and stale events (a descriptor reused within this batch) apart by itself.
          Advance(found->second);
          if (found->second.phase == Phase::closed) {
            connections_.erase(found);
          }
        }
      }
      now_ = Clock::now();
      ExpireDeadlines();
      if (stopBy_ && (connections_.empty() || *stopBy_ <= now_)) {
        return;  // every request begun is answered, or the grace is spent
      }
      if (acceptPausedUntil_ && *acceptPausedUntil_ <= now_ && listenFd_ >= 0) {
        acceptPausedUntil_.reset();
        Watch(listenFd_, EPOLLIN, EPOLL_CTL_MOD);
      }
    }
  }

 private:
  enum class Phase { handshaking, readingHead, readingBody, handling, writing, lingering, closed };

  struct Connection {
    int fd = -1;
    uint64_t id = 0;  // unique for the server's life: a worker's answer names it
    Phase phase = Phase::readingHead;
    uint32_t events = EPOLLIN;  // what epoll watches for it now; 0: not watched (handling)
    std::unique_ptr<SecureSession> session;  // with a transport (TLS)
    uint32_t sessionWaits = 0;  // what the session's last call waits for, when not the phase's
    Clock::time_point accepted;
    Clock::time_point deadline;
    std::string peer;            // the peer's address bytes (an IPv4-mapped IPv6 one as IPv4)
    bool authenticated = false;  // it presented a verified client certificate
    Clock::time_point started;   // the current request's start (HttpRequest::accepted)
    size_t served = 0;           // answers begun on this connection
    bool keepAlive = false;      // the answer being written leaves it open for the next request
    bool pipelined = false;      // bytes came after the request: closed after its answer
    bool receivedAny = false;    // of the current request
    // Head: the bytes so far (at most maxHeaderBytes + 1), where the next line starts, and how
    // far a line end has been looked for (a trickled line is not searched from its start again).
    std::string head;
    size_t parsed = 0;
    size_t scanned = 0;
    bool requestLineSeen = false;
    RequestLine request;
    HeaderSummary headers;
    const Route* route = nullptr;
    // Body: dropped as it comes, or kept for a POST route (counted in bufferedBodies_).
    BodyFraming framing = BodyFraming::none;
    uint64_t bodyLeft = 0;
    std::optional<ChunkedBody> chunked;
    bool keepBody = false;
    std::string body;
    size_t reserved = 0;
    // Answer.
    std::string out;
    size_t sent = 0;
    size_t discarded = 0;
  };

  // Woken by Stop. Without a grace: false, the loop ends at once. With one (HttpServer::Stop):
  // the listening socket closes, so a new connect is refused and a balancer sends it elsewhere;
  // kept connections idle between requests close (nothing of a request came on them); the rest
  // are served to their end, each answer closing its connection, until none is left or the grace
  // is spent.
  bool BeginStop() {
    uint64_t count = 0;
    (void)::read(wakeFd_, &count, sizeof count);
    const int64_t grace = shutdown_.graceMilliseconds.load();
    if (grace <= 0 || stopBy_) return false;
    stopBy_ = now_ + std::chrono::milliseconds(grace);
    if (listenFd_ >= 0) {
      Watch(listenFd_, 0, EPOLL_CTL_DEL);
      ::close(listenFd_);
      listenFd_ = -1;
      shutdown_.listenerClosed = true;
    }
    acceptPausedUntil_.reset();
    if (shutdown_.beginning) shutdown_.beginning();
    for (auto it = connections_.begin(); it != connections_.end();) {
      // A kept connection whose next request is already in its socket (sent as the stop began,
      // not yet read) is served like any request begun: closing it would drop that request.
      if (IdleBetweenRequests(it->second) && !BytesWaiting(it->second.fd)) {
        Close(it->second);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    return true;
  }

  static bool BytesWaiting(int fd) {
    int count = 0;
    return ::ioctl(fd, FIONREAD, &count) == 0 && count > 0;
  }

  static bool IdleBetweenRequests(const Connection& connection) {
    return connection.phase == Phase::readingHead && connection.served > 0 &&
           !connection.receivedAny;
  }

  int TimeoutMilliseconds() const {
    std::optional<Clock::time_point> next = acceptPausedUntil_;
    if (stopBy_ && (!next || *stopBy_ < *next)) next = stopBy_;
    for (const auto& [fd, connection] : connections_) {
      if (!next || connection.deadline < *next) {
        next = connection.deadline;
      }
    }
    if (!next) {
      return -1;
    }
    if (*next <= now_) {
      return 0;
    }
    // Rounded up, so the loop does not wake a hair early and spin until the deadline.
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(*next - now_).count();
    return static_cast<int>(std::min<int64_t>(wait, 60'000));
  }

  void Watch(int fd, uint32_t events, int operation) {
    epoll_event event{};
    event.events = events;
    event.data.fd = fd;
    epoll_ctl(epollFd_, operation, fd, &event);
  }

  // The address bytes a peer is counted by: 4 for IPv4 (an IPv4-mapped IPv6 address too), 16
  // for IPv6, the family alone for anything else.
  static std::string PeerKey(const sockaddr_storage& address) {
    if (address.ss_family == AF_INET) {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
      return std::string(reinterpret_cast<const char*>(&v4.sin_addr), 4);
    }
    if (address.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
      const auto* bytes = reinterpret_cast<const char*>(&v6.sin6_addr);
      if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return std::string(bytes + 12, 4);
      return std::string(bytes, 16);
    }
    return std::string(1, static_cast<char>(address.ss_family));
  }

  void AcceptBurst() {
    for (int i = 0; i < kAcceptBurst; ++i) {
      sockaddr_storage address{};
      socklen_t addressSize = sizeof address;
      const int fd = accept4(listenFd_, reinterpret_cast<sockaddr*>(&address), &addressSize,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) {
          continue;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          acceptPausedUntil_ = now_ + kAcceptPause;
          Watch(listenFd_, 0, EPOLL_CTL_MOD);
        }
        return;  // EAGAIN: all taken
      }
      counters_.accepted.fetch_add(1, std::memory_order_relaxed);
      std::string peer = PeerKey(address);
      if (!MakeRoom(peer)) {
        ::close(fd);
        continue;
      }

      // Answers are one write each: without TCP_NODELAY a small one can wait on the client's
      // delayed ACK (about 40 ms per call; docs/benchmarks.md, "Through the API server").
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Connection& connection = connections_[fd];
      connection.fd = fd;
      connection.id = ++lastId_;
      connection.accepted = now_;
      connection.started = now_;
      connection.deadline = now_ + limits_.headerDeadline;
      connection.peer = std::move(peer);
      PeerCount& count = peers_[connection.peer];
      ++count.all;
      ++count.unauthenticated;
      counters_.open.fetch_add(1, std::memory_order_relaxed);
      Watch(fd, EPOLLIN, EPOLL_CTL_ADD);
      if (transport_ != nullptr) {
        // The TLS session is made when the first bytes come (Handshake): a connection that
        // never sends any, a flood's, costs no session at all.
        connection.phase = Phase::handshaking;
        if (limits_.handshakeDeadline.count() > 0) {
          connection.deadline = now_ + std::min(limits_.handshakeDeadline, limits_.headerDeadline);
        }
        continue;
      }
      // A probe sends its request with the connect: answer it now, before more accepts can
      // push it out.
      Advance(connection);
      if (connection.phase == Phase::closed) {
        connections_.erase(fd);
      }
    }
  }

  // How readily a connection goes to make room for a new one from `newPeer`: the lowest rank
  // first; nullopt when it stays (HttpLimits::maxConnections says why).
  static std::optional<int> Rank(Connection& connection, std::string_view newPeer) {
    switch (connection.phase) {
      case Phase::lingering:
        return 0;  // answered already
      case Phase::handling:
      case Phase::closed:
        return std::nullopt;  // its request is read and a worker answers it
      case Phase::writing:
        // Being answered. An authenticated caller's answer is never cut; anyone else's goes
        // last, so that clients that do not read their answers (a /metrics it never takes)
        // cannot hold every slot of a server without a client CA for the write deadline.
        if (connection.authenticated) return std::nullopt;
        return 4;
      case Phase::handshaking:
      case Phase::readingHead:
      case Phase::readingBody:
        break;
    }
    const bool silent = connection.phase == Phase::handshaking
                            ? !connection.session || !connection.session->ReceivedAny()
                            : !connection.receivedAny;
    if (connection.authenticated) {
      // Idle between requests, it gives way only to its own address's new connection.
      if (silent && connection.peer == newPeer) return 3;
      return std::nullopt;
    }
    return silent ? 1 : 2;
  }

  // The connection to close for a new one from `newPeer`, among those `eligible` says may go:
  // the lowest rank, then the address holding the most connections, then the oldest.
  template <class Eligible>
  std::unordered_map<int, Connection>::iterator PickVictim(std::string_view newPeer,
                                                           Eligible eligible) {
    auto victim = connections_.end();
    std::tuple<int, int64_t, Clock::time_point> best{};
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (!eligible(it->second)) continue;
      const std::optional<int> rank = Rank(it->second, newPeer);
      if (!rank) continue;
      const auto held = peers_.find(it->second.peer);
      const int64_t crowd = held == peers_.end() ? 0 : static_cast<int64_t>(held->second.all);
      const std::tuple<int, int64_t, Clock::time_point> key{*rank, -crowd, it->second.accepted};
      if (victim == connections_.end() || key < best) {
        victim = it;
        best = key;
      }
    }
    return victim;
  }

  // Closes `victim` to make room; an answered one whose client has closed already just goes.
  void Evict(std::unordered_map<int, Connection>::iterator victim, std::atomic<int64_t>& counter) {
    if (victim->second.phase == Phase::lingering) {
      Linger(victim->second);
    }
    if (victim->second.phase != Phase::closed) {
      counter.fetch_add(1, std::memory_order_relaxed);
      Close(victim->second);
    }
    connections_.erase(victim);
  }

  // Room for a new connection from `peer` (HttpLimits::maxConnectionsPerPeer, maxConnections);
  // false when it is to be turned away.
  bool MakeRoom(const std::string& peer) {
    if (limits_.maxConnectionsPerPeer > 0) {
      const auto held = peers_.find(peer);
      if (held != peers_.end() && held->second.unauthenticated >= limits_.maxConnectionsPerPeer) {
        const auto victim = PickVictim(peer, [&peer](const Connection& connection) {
          return connection.peer == peer && !connection.authenticated;
        });
        if (victim == connections_.end()) {
          // All its own are being answered: its new one waits for none of them to end.
          counters_.peerCapped.fetch_add(1, std::memory_order_relaxed);
          return false;
        }
        Evict(victim, counters_.peerCapped);
      }
    }
    if (connections_.size() < limits_.maxConnections) {
      return true;
    }
    const auto victim = PickVictim(peer, [](const Connection&) { return true; });
    if (victim == connections_.end()) {
      counters_.turnedAway.fetch_add(1, std::memory_order_relaxed);
      counters_.lastRefusal.store(now_.time_since_epoch().count(), std::memory_order_relaxed);
      return false;
    }
    Evict(victim, counters_.overflowed);
    return true;
  }

  void ExpireDeadlines() {
    for (auto it = connections_.begin(); it != connections_.end();) {
      Connection& connection = it->second;
      if (connection.deadline > now_) {
        ++it;
        continue;
      }
      if (IdleBetweenRequests(connection)) {
        // A kept connection whose next request did not come: closed silently, as planned.
      } else if (connection.phase == Phase::readingHead || connection.phase == Phase::readingBody ||
                 connection.phase == Phase::handshaking) {
        counters_.timedOut.fetch_add(1, std::memory_order_relaxed);
        // Part of a request came: say why it is closed, if the socket takes it at once. A
        // connection that sent nothing is closed silently (a client's idle pool is no error).
        if (connection.receivedAny) {
          const std::string timeout = FormatResponse(Refusal(408), false);
          size_t count = 0;
          if (connection.session) {
            (void)connection.session->Write(timeout.data(), timeout.size(), count);
          } else {
            (void)::send(connection.fd, timeout.data(), timeout.size(), MSG_NOSIGNAL);
          }
        }
      } else if (connection.phase == Phase::writing || connection.phase == Phase::handling) {
        counters_.timedOut.fetch_add(1, std::memory_order_relaxed);
      }
      Close(connection);
      it = connections_.erase(it);
    }
  }

  // Runs the connection's phases as far as its socket allows right now.
  void Advance(Connection& connection) {
    for (bool again = true; again;) {
      again = false;
      if (connection.phase == Phase::handshaking) {
        Handshake(connection);
      }
      if (connection.phase == Phase::readingHead) {
        ReadHead(connection);
      }
      if (connection.phase == Phase::readingBody) {
        ReadBody(connection);
      }
      if (connection.phase == Phase::writing) {
        Write(connection);
        // Kept open: what already came of the next request (a TLS record read with the last
        // one, which epoll will not report) is read now. Each round answers a request, and a
        // connection carries at most requestsPerConnection of them.
        again = connection.phase == Phase::readingHead;
      }
      if (connection.phase == Phase::lingering) {
        Linger(connection);
      }
    }
    if (connection.phase == Phase::closed) {
      return;
    }
    if (connection.phase == Phase::handling) {
      // Nothing to do until the worker answers: not watched, so that a client's bytes or
      // hang-up cannot make the loop spin (the handler deadline still closes it).
      if (connection.events != 0) {
        Watch(connection.fd, 0, EPOLL_CTL_DEL);
        connection.events = 0;
      }
      return;
    }
    uint32_t wanted = connection.phase == Phase::writing ? EPOLLOUT : EPOLLIN;
    if (connection.sessionWaits != 0 && connection.phase != Phase::lingering) {
      wanted = connection.sessionWaits;
    }
    if (wanted != connection.events) {
      Watch(connection.fd, wanted, connection.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD);
      connection.events = wanted;
    }
  }

  void Close(Connection& connection) {
    if (const auto held = peers_.find(connection.peer); held != peers_.end()) {
      --held->second.all;
      if (!connection.authenticated) --held->second.unauthenticated;
      if (held->second.all == 0) peers_.erase(held);
    }
    counters_.open.fetch_sub(1, std::memory_order_relaxed);
    bufferedBodies_ -= connection.reserved;
    connection.reserved = 0;
    connection.session.reset();
    ::close(connection.fd);
    connection.phase = Phase::closed;
  }

  void Handshake(Connection& connection) {
    if (!connection.session) {
      connection.session = transport_->Accept(connection.fd);
      if (!connection.session) {
        counters_.handshakeFailures.fetch_add(1, std::memory_order_relaxed);
        Close(connection);
        return;
      }
    }
    connection.sessionWaits = 0;
    switch (connection.session->Handshake()) {
      case SecureSession::Io::done:
        connection.phase = Phase::readingHead;
        connection.deadline = connection.accepted + limits_.headerDeadline;
        if (connection.session->PeerVerified()) {
          connection.authenticated = true;
          if (const auto held = peers_.find(connection.peer); held != peers_.end()) {
            --held->second.unauthenticated;
          }
        }
        return;
      case SecureSession::Io::wantRead:
        connection.sessionWaits = EPOLLIN;
        return;
      case SecureSession::Io::wantWrite:
        connection.sessionWaits = EPOLLOUT;
        return;
      case SecureSession::Io::closed:
      case SecureSession::Io::failed:
        counters_.handshakeFailures.fetch_add(1, std::memory_order_relaxed);
        Close(connection);
        return;
    }
  }

  // recv into buffer; the count, 0 at EOF, -1 when nothing is there now (EAGAIN), or -2 on
  // an error (the connection is then useless).
  static ssize_t RawReceive(int fd, char* buffer, size_t size) {
    for (;;) {
      const ssize_t received = ::recv(fd, buffer, size, 0);
      if (received >= 0) {
        return received;
      }
      if (errno == EINTR) {
        continue;
      }
      return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : -2;
    }
  }

  // The same through the connection's session when it has one.
  static ssize_t Receive(Connection& connection, char* buffer, size_t size) {
    if (!connection.session) {
      return RawReceive(connection.fd, buffer, size);
    }
    connection.sessionWaits = 0;
    size_t count = 0;
    switch (connection.session->Read(buffer, size, count)) {
      case SecureSession::Io::done:
        return static_cast<ssize_t>(count);
      case SecureSession::Io::wantRead:
        return -1;
      case SecureSession::Io::wantWrite:
        connection.sessionWaits = EPOLLOUT;
        return -1;
      case SecureSession::Io::closed:
        return 0;
      case SecureSession::Io::failed:
        return -2;
    }
    return -2;
  }

  // send; the count, -1 when the socket takes nothing now, -2 on an error.
  static ssize_t Send(Connection& connection, const char* data, size_t size) {
    if (!connection.session) {
      for (;;) {
        const ssize_t sent = ::send(connection.fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent >= 0) return sent;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : -2;
      }
    }
    connection.sessionWaits = 0;
    size_t count = 0;
    switch (connection.session->Write(data, size, count)) {
      case SecureSession::Io::done:
        return static_cast<ssize_t>(count);
      case SecureSession::Io::wantWrite:
        return -1;
      case SecureSession::Io::wantRead:
        connection.sessionWaits = EPOLLIN;
        return -1;
      case SecureSession::Io::closed:
      case SecureSession::Io::failed:
        return -2;
    }
    return -2;
  }

  void ReadHead(Connection& connection) {
    std::array<char, 4096> buffer{};
    while (connection.phase == Phase::readingHead) {
      // Never more than one byte past the cap, so the head's buffer is bounded by it.
      const size_t room = limits_.maxHeaderBytes + 1 - connection.head.size();
      const ssize_t received = Receive(connection, buffer.data(), std::min(room, buffer.size()));
      if (received == -1) {
        return;
      }
      if (received <= 0) {
        Close(connection);  // the client gave up, or the connection broke
        return;
      }
      if (!connection.receivedAny && connection.served > 0) {
        // A kept connection's next request: its deadlines count from its first byte.
        connection.started = now_;
        connection.deadline = now_ + limits_.headerDeadline;
        counters_.reused.fetch_add(1, std::memory_order_relaxed);
      }
      connection.receivedAny = true;
      connection.head.append(buffer.data(), static_cast<size_t>(received));
      ParseHead(connection);
    }
  }

  // The methods a path answers, for a 405's Allow.
  static std::string_view Allowed(const Route* route) {
    if (route != nullptr && route->post && route->get) return "GET, HEAD, POST";
    if (route != nullptr && route->post) return "POST";
    return "GET, HEAD";
  }

  // The request line arrived: a method the path does not answer is refused before its headers.
  void TakeRequestLine(Connection& connection, std::string_view line) {
    connection.request = ParseRequestLine(line);
    connection.requestLineSeen = true;
    if (connection.request.status != 0) {
      Refuse(connection, connection.request.status);  // a PUT is 405 before its headers
      return;
    }
    const auto found = routes_.find(connection.request.path);
    connection.route = found == routes_.end() ? nullptr : &found->second;
    if (connection.route == nullptr) {
      // Unknown paths: 404 once the request is read, as before; a POST is not read at all.
      if (connection.request.post) Refuse(connection, 404);
      return;
    }
    const bool served = connection.request.post ? static_cast<bool>(connection.route->post)
                                                : static_cast<bool>(connection.route->get);
    if (!served) {
      Refuse(connection, 405);
    }
  }

  // Consumes the complete lines of the head received so far.
  void ParseHead(Connection& connection) {
    while (connection.phase == Phase::readingHead) {
      const size_t newline =
          connection.head.find('\n', std::max(connection.parsed, connection.scanned));
      if (newline == std::string::npos) {
        connection.scanned = connection.head.size();
        break;
      }
      const size_t next = newline + 1;
      if (next > limits_.maxHeaderBytes) {
        break;  // refused below
      }
      std::string_view line(connection.head.data() + connection.parsed,
                            newline - connection.parsed);
      if (!line.empty() && line.back() == '\r') {
        line.remove_suffix(1);  // CRLF, though a bare LF is read as a line end too (RFC 9112 §2.2)
      }
      connection.parsed = next;
      if (!connection.requestLineSeen) {
        if (line.empty()) {
          continue;  // empty lines before the request line are to be ignored (RFC 9112 §2.2)
        }
        TakeRequestLine(connection, line);
      } else if (line.empty()) {
        FinishHead(connection);
      } else if (const int status = connection.headers.Add(line); status != 0) {
        Refuse(connection, status);
      }
    }
    if (connection.phase == Phase::readingHead && connection.head.size() > limits_.maxHeaderBytes) {
      Refuse(connection, connection.requestLineSeen ? 431 : 414);
    }
  }

  // Counts `bytes` more of kept body against the budget; false (and refused 503) when it is
  // spent.
  bool Reserve(Connection& connection, size_t bytes) {
    if (bytes >
        limits_.maxBufferedBodyBytes - std::min(bufferedBodies_, limits_.maxBufferedBodyBytes)) {
      Busy(connection);
      return false;
    }
    bufferedBodies_ += bytes;
    connection.reserved += bytes;
    return true;
  }

  // The empty line arrived: judge the framing, then read any body or answer.
  void FinishHead(Connection& connection) {
    const HeaderSummary& headers = connection.headers;
    const bool http11 = connection.request.minorVersion >= 1;
    connection.keepBody = connection.request.post && connection.route != nullptr;
    const size_t maxBody =
        connection.keepBody ? connection.route->maxBodyBytes : limits_.maxBodyBytes;
    int status = 0;
    if ((http11 && headers.hosts != 1) || headers.hosts > 1 || headers.contentLengths > 1 ||
        headers.transferEncodings > 1 ||
        (headers.transferEncodings > 0 && (headers.contentLengths > 0 || !http11))) {
      status = 400;  // RFC 9112 §3.2, §6.1, §6.3: ambiguous framing is how requests get smuggled
    } else if (headers.transferEncodings > 0 &&
               !EqualsIgnoreCase(headers.transferEncoding, "chunked")) {
      status = 501;
    } else if (headers.contentLength && *headers.contentLength > maxBody) {
      status = 413;
    }
    if (status != 0) {
      Refuse(connection, status);
      return;
    }
    // The bytes after the head are the body's start; the head itself is no longer needed.
    const std::string rest = connection.head.substr(connection.parsed);
    connection.head.clear();
    connection.head.shrink_to_fit();
    if (headers.transferEncodings > 0) {
      connection.framing = BodyFraming::chunked;
      connection.chunked.emplace(maxBody);
    } else if (headers.contentLength && *headers.contentLength > 0) {
      connection.framing = BodyFraming::length;
      connection.bodyLeft = *headers.contentLength;
      if (connection.keepBody) {
        const auto length = static_cast<size_t>(*headers.contentLength);
        if (!Reserve(connection, length)) {
          return;
        }
        connection.body.reserve(length);
      }
    } else {
      connection.pipelined = !rest.empty();
      Answer(connection);
      return;
    }
    connection.phase = Phase::readingBody;
    TakeBody(connection, rest);
  }

  void ReadBody(Connection& connection) {
    std::array<char, 4096> buffer{};
    while (connection.phase == Phase::readingBody) {
      size_t want = buffer.size();
      if (connection.framing == BodyFraming::length) {
        want = static_cast<size_t>(std::min<uint64_t>(want, connection.bodyLeft));
      }
      const ssize_t received = Receive(connection, buffer.data(), want);
      if (received == -1) {
        return;
      }
      if (received <= 0) {
        Close(connection);
        return;
      }
      TakeBody(connection, std::string_view(buffer.data(), static_cast<size_t>(received)));
    }
  }

  // Takes body bytes (kept for a POST route, else dropped), answering once the body has ended.
  // Bytes past its end (a pipelined request) are ignored: one request per connection.
  void TakeBody(Connection& connection, std::string_view bytes) {
    if (connection.framing == BodyFraming::length) {
      const auto take = static_cast<size_t>(std::min<uint64_t>(connection.bodyLeft, bytes.size()));
      if (connection.keepBody) {
        connection.body.append(bytes.substr(0, take));  // reserved at the head
      }
      connection.bodyLeft -= take;
      if (connection.bodyLeft == 0) {
        connection.pipelined = bytes.size() > take;
        Answer(connection);
      }
      return;
    }
    const ChunkedBody::Result result =
        connection.chunked->Feed(bytes, connection.keepBody ? &connection.body : nullptr);
    if (connection.body.size() > connection.reserved &&
        !Reserve(connection, connection.body.size() - connection.reserved)) {
      return;
    }
    switch (result) {
      case ChunkedBody::Result::needMore:
        return;
      case ChunkedBody::Result::done:
        connection.pipelined = connection.chunked->leftover() > 0;
        Answer(connection);
        return;
      case ChunkedBody::Result::malformed:
        Refuse(connection, 400);
        return;
      case ChunkedBody::Result::tooLarge:
        Refuse(connection, 413);
        return;
    }
  }

  void Answer(Connection& connection) {
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    HttpResponse response;
    if (connection.route == nullptr) {
      response = Refusal(404);
    } else if (connection.request.post) {
      Dispatch(connection);
      return;
    } else {
      try {
        response = connection.route->get();
      } catch (...) {
        response = Refusal(500);  // a handler's bug must not take the daemon down
      }
      if (!Sendable(response)) {
        response = Refusal(500);
      }
    }
    StartAnswer(connection, response, connection.request.headOnly);
  }

  // A complete POST goes to the workers, or is refused at once when they are all taken.
  void Dispatch(Connection& connection) {
    Workers::Job job;
    job.id = connection.id;
    job.fd = connection.fd;
    job.handler = &connection.route->post;
    job.request.path = connection.request.path;
    job.request.query = connection.request.query;
    job.request.body = std::move(connection.body);
    job.request.accepted = connection.started;
    job.reserved = connection.reserved;
    if (workers_ == nullptr || !workers_->TrySubmit(std::move(job))) {
      counters_.requests.fetch_sub(1, std::memory_order_relaxed);
      connection.body.clear();
      Busy(connection);
      return;
    }
    connection.reserved = 0;  // the job holds the body now; its answer gives the bytes back
    connection.body = {};
    connection.phase = Phase::handling;
    connection.deadline = connection.started + limits_.handlerDeadline;
  }

  // Workers' answers: each goes to its connection if that is still waiting for it.
  void TakeAnswers() {
    for (Workers::Done& done : workers_->TakeDone()) {
      bufferedBodies_ -= std::min(bufferedBodies_, done.reserved);
      const auto found = connections_.find(done.fd);
      if (found == connections_.end() || found->second.id != done.id ||
          found->second.phase != Phase::handling) {
        continue;  // closed meanwhile (deadline, eviction, Stop): the answer is dropped
      }
      Connection& connection = found->second;
      StartAnswer(connection, done.response, false);
      Advance(connection);
      if (connection.phase == Phase::closed) {
        connections_.erase(found);
      }
    }
  }

  void Refuse(Connection& connection, int status, bool counted = true) {
    if (counted) {
      counters_.rejected.fetch_add(1, std::memory_order_relaxed);
    }
    const bool headOnly = connection.requestLineSeen && connection.request.headOnly;
    StartWriting(connection, FormatResponse(Refusal(status), headOnly,
                                            status == 405 ? Allowed(connection.route) : ""));
  }

  // 503: the pool or the body budget is full. Readiness says so for a while (Saturated()).
  void Busy(Connection& connection) {
    counters_.busy.fetch_add(1, std::memory_order_relaxed);
    counters_.lastRefusal.store(now_.time_since_epoch().count(), std::memory_order_relaxed);
    Refuse(connection, 503, false);
  }

  // A request read whole and answered (by its handler, or 404): the connection stays open for
  // the next one when keep-alive allows (HttpLimits::requestsPerConnection) and the server is
  // not draining (HttpServer::Drain).
  void StartAnswer(Connection& connection, const HttpResponse& response, bool headOnly) {
    const bool keep = connection.served + 1 < limits_.requestsPerConnection &&
                      connection.request.minorVersion >= 1 && !connection.headers.close &&
                      !connection.pipelined && !shutdown_.draining.load(std::memory_order_relaxed);
    StartWriting(connection, FormatResponse(response, headOnly, {}, !keep));
    connection.keepAlive = keep;
  }

  // The connection as it was before its last request, waiting for the next one.
  void Renew(Connection& connection) {
    bufferedBodies_ -= connection.reserved;
    connection.reserved = 0;
    connection.out.clear();
    connection.out.shrink_to_fit();
    connection.sent = 0;
    connection.head.clear();
    connection.parsed = 0;
    connection.scanned = 0;
    connection.requestLineSeen = false;
    connection.request = {};
    connection.headers = {};
    connection.route = nullptr;
    connection.framing = BodyFraming::none;
    connection.bodyLeft = 0;
    connection.chunked.reset();
    connection.keepBody = false;
    connection.body = {};
    connection.keepAlive = false;
    connection.receivedAny = false;
    connection.sessionWaits = 0;
    connection.phase = Phase::readingHead;
    connection.deadline = now_ + limits_.keepAliveIdle;
  }

  // Every answer, the server's refusals too (which close the connection: keepAlive stays false).
  void StartWriting(Connection& connection, std::string out) {
    ++connection.served;
    connection.keepAlive = false;
    connection.head.clear();
    connection.head.shrink_to_fit();
    connection.out = std::move(out);
    connection.sent = 0;
    connection.phase = Phase::writing;
    connection.deadline = now_ + limits_.writeDeadline;
  }

  void Write(Connection& connection) {
    while (connection.sent < connection.out.size()) {
      const ssize_t sent = Send(connection, connection.out.data() + connection.sent,
                                connection.out.size() - connection.sent);
      if (sent == -1) {
        return;
      }
      if (sent < 0) {
        Close(connection);  // EPIPE, ECONNRESET: the client is gone
        return;
      }
      connection.sent += static_cast<size_t>(sent);
    }
    if (connection.keepAlive) {
      Renew(connection);
      // Promised before the stop began: idle now, it closes as the others did (BeginStop).
      if (stopBy_) Close(connection);
      return;
    }
    // All handed to the kernel: our FIN follows the answer (TLS: after close_notify); then
    // drop what the client still sends until it closes too.
    if (connection.session) {
      connection.session->Shutdown();
      connection.sessionWaits = 0;
    }
    ::shutdown(connection.fd, SHUT_WR);
    connection.out.clear();
    connection.out.shrink_to_fit();
    bufferedBodies_ -= connection.reserved;  // a refused body's bytes are no longer kept
    connection.reserved = 0;
    connection.body = {};
    connection.phase = Phase::lingering;
    connection.deadline = std::min(connection.deadline, now_ + kLingerTime);
  }

  void Linger(Connection& connection) {
    std::array<char, 4096> buffer{};
    for (;;) {
      const ssize_t received = RawReceive(connection.fd, buffer.data(), buffer.size());
      if (received == -1) {
        return;
      }
      connection.discarded += static_cast<size_t>(std::max<ssize_t>(received, 0));
      if (received <= 0 || connection.discarded > kLingerBytes) {
        Close(connection);
        return;
      }
    }
  }

  HttpLimits limits_;
  const std::map<std::string, Route, std::less<>>& routes_;
  Counters& counters_;
  Shutdown& shutdown_;
  SecureTransport* transport_;
  Workers* workers_;
  int listenFd_;
  int wakeFd_;
  int epollFd_;
  uint64_t lastId_ = 0;
  size_t bufferedBodies_ = 0;  // bytes reserved by connections and jobs
  struct PeerCount {
    size_t all = 0;
    size_t unauthenticated = 0;
  };
  std::unordered_map<std::string, PeerCount> peers_;  // by Connection::peer
  Clock::time_point now_ = Clock::now();
  std::optional<Clock::time_point> acceptPausedUntil_;
  std::optional<Clock::time_point> stopBy_;  // stopping gracefully: the end of the grace
  std::unordered_map<int, Connection> connections_;
};

std::pair<std::string, int> ParseListenAddress(const std::string& address) {
  const std::pair<std::string, int> malformed{"", -1};
  std::string host;
  std::string_view port;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close == 1 || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return malformed;
    }
    host = address.substr(1, close - 1);
    port = std::string_view(address).substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return malformed;
    }
    host = address.substr(0, colon);
    if (host.find_first_of(":[]") != std::string::npos) {
      return malformed;  // "::1:8080" could be either; IPv6 literals go in brackets
    }
    if (host.empty()) {
      host = "0.0.0.0";
    }
    port = std::string_view(address).substr(colon + 1);
  }
  const std::optional<uint64_t> number = ParseDecimal(port);
  if (!number || port.size() > 5 || *number > 65535) {
    return malformed;
  }
  return {host, static_cast<int>(*number)};
}

HttpServer::HttpServer(HttpLimits limits) : limits_(limits) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(std::string path, Handler handler) {
  if (thread_.joinable()) {
    return;  // the server's thread reads the table without a lock
  }
  routes_[std::move(path)].get = std::move(handler);
}

void HttpServer::HandlePost(std::string path, PostHandler handler, size_t maxBodyBytes) {
  if (thread_.joinable()) {
    return;
  }
  Route& route = routes_[std::move(path)];
  route.post = std::move(handler);
  route.maxBodyBytes = maxBodyBytes;
}

void HttpServer::UseTransport(std::shared_ptr<SecureTransport> transport) {
  if (thread_.joinable()) {
    return;
  }
  transport_ = std::move(transport);
}

// Opens the listening socket on the first of the host's addresses that takes it.
bool HttpServer::Listen(const std::string& address, const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int status = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); status != 0) {
    error_ = "listen address " + address + ": " + host + ": " + gai_strerror(status);
    return false;
  }
  // Accepted sockets inherit this: a request is at most head + body, and a fixed receive
  // buffer stops the kernel growing it (socket memory counts against the pod's cgroup).
  size_t maxBody = limits_.maxBodyBytes;
  for (const auto& [path, route] : routes_) {
    if (route.post) maxBody = std::max(maxBody, route.maxBodyBytes);
  }
  const int receiveBuffer =
      static_cast<int>(std::clamp<size_t>(limits_.maxHeaderBytes + maxBody, 16 * 1024, 256 * 1024));
  std::string failure;
  for (const addrinfo* candidate = found; candidate != nullptr && listenFd_ < 0;
       candidate = candidate->ai_next) {
    const int fd =
        ::socket(candidate->ai_family, candidate->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      failure = std::string("socket: ") + ErrnoText(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer);
    if (::bind(fd, candidate->ai_addr, candidate->ai_addrlen) != 0) {
      failure = std::string("bind: ") + ErrnoText(errno);
      ::close(fd);
      continue;
    }
    if (::listen(fd, kListenBacklog) != 0) {
      failure = std::string("listen: ") + ErrnoText(errno);
      ::close(fd);
      continue;
    }
    listenFd_ = fd;
  }
  freeaddrinfo(found);
  if (listenFd_ < 0) {
    error_ = "listen address " + address + ": " + failure;
    return false;
  }
  return true;
}

bool HttpServer::Start(const std::string& address) {
  if (thread_.joinable()) {
    error_ = "listen address " + address + ": already serving on port " + std::to_string(port_);
    return false;
  }
  error_.clear();
  if (address == "off") {
    return true;
  }
  const auto [host, port] = ParseListenAddress(address);
  if (port < 0) {
    error_ = "listen address \"" + address + "\": not host:port, [IPv6]:port, :port or off";
    return false;
  }

  if (!Listen(address, host, port)) return false;

  sockaddr_storage bound{};
  socklen_t boundSize = sizeof bound;
  if (::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&bound), &boundSize) != 0) {
    error_ = "listen address " + address + ": getsockname: " + ErrnoText(errno);
    CloseDescriptors();
    return false;
  }
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epollFd_ < 0 || wakeFd_ < 0) {
    error_ = "listen address " + address + ": epoll/eventfd: " + ErrnoText(errno);
    CloseDescriptors();
    return false;
  }
  const bool posts = std::any_of(routes_.begin(), routes_.end(),
                                 [](const auto& entry) { return entry.second.post != nullptr; });
  if (posts) {
    workers_ = std::make_unique<Workers>(limits_.workers, limits_.queuedRequests);
    std::string workersError;
    if (!workers_->Start(workersError)) {
      error_ = "listen address " + address + ": " + workersError;
      workers_.reset();
      CloseDescriptors();
      return false;
    }
  }
  for (const int fd : {listenFd_, wakeFd_, workers_ ? workers_->doneFd() : -1}) {
    if (fd < 0) continue;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &event);
  }
  loop_ = std::make_unique<Loop>(limits_, routes_, counters_, shutdown_, transport_.get(),
                                 workers_.get(), listenFd_, wakeFd_, epollFd_);
  try {
    thread_ = std::thread([loop = loop_.get()] { loop->Run(); });
    // Named from here, so that it has its name (in top, /proc) once Start returns.
    pthread_setname_np(thread_.native_handle(), "http-server");
  } catch (const std::system_error& failed) {
    error_ = "listen address " + address + ": starting the server thread: " + failed.what();
    loop_.reset();
    workers_.reset();
    CloseDescriptors();
    return false;
  }
  return true;
}

void HttpServer::Drain() { shutdown_.draining = true; }

void HttpServer::StopServing(std::chrono::milliseconds grace) {
  if (!thread_.joinable()) return;
  if (grace.count() > 0) shutdown_.draining = true;
  shutdown_.graceMilliseconds = grace.count();
  const uint64_t one = 1;
  (void)::write(wakeFd_, &one, sizeof one);
  thread_.join();
}

void HttpServer::Stop(std::chrono::milliseconds grace) {
  StopServing(grace);
  if (shutdown_.listenerClosed.exchange(false)) listenFd_ = -1;  // the thread closed it
  shutdown_.draining = false;
  shutdown_.graceMilliseconds = 0;
  workers_.reset();  // joins the workers once their handlers return
  loop_.reset();     // closes the connections
  counters_.open.store(0);
  CloseDescriptors();
}

void HttpServer::CloseDescriptors() {
  for (int* fd : {&listenFd_, &wakeFd_, &epollFd_}) {
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  }
  port_ = 0;
}

HttpServer::Stats HttpServer::stats() const {
  Stats stats{counters_.requests.load(), counters_.rejected.load(), counters_.timedOut.load(),
              counters_.overflowed.load(), counters_.accepted.load()};
  stats.busy = counters_.busy.load();
  stats.handshakeFailures = counters_.handshakeFailures.load();
  stats.peerCapped = counters_.peerCapped.load();
  stats.turnedAway = counters_.turnedAway.load();
  stats.reused = counters_.reused.load();
  stats.open = counters_.open.load();
  if (workers_) {
    stats.active = workers_->active();
    stats.queued = workers_->queued();
  }
  return stats;
}

bool HttpServer::Saturated() const {
  if (workers_ && workers_->Saturated()) return true;
  const int64_t last = counters_.lastRefusal.load(std::memory_order_relaxed);
  return last != INT64_MIN &&
         Clock::now().time_since_epoch().count() - last <
             std::chrono::duration_cast<Clock::duration>(limits_.refusingWindow).count();
}

}  // namespace cozy::runtime
