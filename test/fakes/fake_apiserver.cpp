#include "test/fakes/fake_apiserver.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <sstream>

#include "test/fakes/fake_apiserver_logic.h"

#include "test/fakes/fake_apiserver_internal.h"

namespace cozy::fake {
using namespace internal;  // NOLINT

namespace {

constexpr size_t kMaxServerThreads = 1024;

// A thread pool that starts empty and adds a thread when a connection arrives and no thread
// is idle, up to `max`; threads stay for the next connection. (httplib::ThreadPool starts a
// fixed number, and one per possible watch would be 1024 threads for every test's server.)
class GrowingPool : public httplib::TaskQueue {
 public:
  explicit GrowingPool(size_t max) : max_(max) {}
  ~GrowingPool() override = default;
  GrowingPool(const GrowingPool&) = delete;
  GrowingPool& operator=(const GrowingPool&) = delete;

  void enqueue(std::function<void()> job) override {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    // A thread waiting counts as idle until it takes a job, so two quick connections do not
    // both count on the same idle thread.
    if (jobs_.size() > idle_ && threads_.size() < max_) {
      threads_.emplace_back([this] { Work(); });
    }
    wake_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      shutdown_ = true;
    }
    wake_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ++idle_;
        wake_.wait(lock, [this] { return shutdown_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  const size_t max_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace

Fault Fault::Answer(int status, int count, std::string method, int retryAfterSeconds) {
  Fault fault;
  fault.status = status;
  fault.count = count;
  fault.method = std::move(method);
  fault.retryAfterSeconds = retryAfterSeconds;
  return fault;
}

Fault Fault::Drop(int count, std::string method) {
  Fault fault;
  fault.dropConnection = true;
  fault.count = count;
  fault.method = std::move(method);
  return fault;
}

namespace {

constexpr std::pair<FaultMode, std::string_view> kFaultModes[] = {
    {FaultMode::kNone, ""},
    {FaultMode::kListResourceVersionNumber, "listResourceVersionNumber"},
    {FaultMode::kListItemsNotArray, "listItemsNotArray"},
    {FaultMode::kListWithoutMetadata, "listWithoutMetadata"},
    {FaultMode::kWatchResourceVersionNumber, "watchResourceVersionNumber"},
    {FaultMode::kWatchMetadataMissing, "watchMetadataMissing"},
    {FaultMode::kWatchObjectNotObject, "watchObjectNotObject"},
    {FaultMode::kWatchUnknownType, "watchUnknownType"},
    {FaultMode::kWatchNotJson, "watchNotJson"},
    {FaultMode::kWatchErrorWrongTypes, "watchErrorWrongTypes"},
    {FaultMode::kWatchCloseAtOnce, "watchCloseAtOnce"},
    {FaultMode::kEndlessBody, "endlessBody"},
    {FaultMode::kEndlessString, "endlessString"},
};

bool IsListMode(FaultMode mode) {
  return mode == FaultMode::kListResourceVersionNumber || mode == FaultMode::kListItemsNotArray ||
         mode == FaultMode::kListWithoutMetadata;
}

bool IsWatchMode(FaultMode mode) {
  return mode == FaultMode::kWatchResourceVersionNumber ||
         mode == FaultMode::kWatchMetadataMissing || mode == FaultMode::kWatchObjectNotObject ||
         mode == FaultMode::kWatchUnknownType || mode == FaultMode::kWatchNotJson ||
         mode == FaultMode::kWatchErrorWrongTypes || mode == FaultMode::kWatchCloseAtOnce;
}

// IMF-fixdate (RFC 9110 §5.6.7), spelled out so no locale can change it.
std::string HttpDate(std::chrono::system_clock::time_point when) {
  static const char* days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t seconds = std::chrono::system_clock::to_time_t(when);
  tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[utc.tm_wday % 7],
                utc.tm_mday, months[utc.tm_mon % 12], utc.tm_year + 1900, utc.tm_hour, utc.tm_min,
                utc.tm_sec);
  return text;
}

}  // namespace

std::string_view FaultModeName(FaultMode mode) {
  for (const auto& [known, name] : kFaultModes) {
    if (known == mode) return name;
  }
  return "";
}

FaultMode ParseFaultMode(std::string_view name) {
  std::string names;
  for (const auto& [mode, known] : kFaultModes) {
    if (known == name) return mode;
    if (!known.empty()) names += (names.empty() ? "" : ", ") + std::string(known);
  }
  throw std::invalid_argument("unknown fault mode \"" + std::string(name) + "\" (known: " + names +
                              ")");
}

Fault Fault::Mode(FaultMode mode, int count, std::string pathPrefix) {
  Fault fault;
  fault.mode = mode;
  fault.count = count;
  fault.pathPrefix = std::move(pathPrefix);
  return fault;
}

Fault Fault::FromJson(const json& value) {
  if (!value.is_object()) throw std::invalid_argument("a fault is a JSON object");
  Fault fault;
  auto wrongType = [](const std::string& key, const char* wanted, const json& field) {
    return std::invalid_argument("fault field \"" + key + "\" must be " + wanted + ", not " +
                                 std::string(field.type_name()));
  };
  for (const auto& [key, field] : value.items()) {
    auto text = [&](std::string& out) {
      if (!field.is_string()) throw wrongType(key, "a string", field);
      out = field.get<std::string>();
    };
    auto flag = [&](bool& out) {
      if (!field.is_boolean()) throw wrongType(key, "true or false", field);
      out = field.get<bool>();
    };
    auto number = [&](int& out) {
      if (!field.is_number_integer() || field.get<int64_t>() < -1 ||
          field.get<int64_t>() > std::numeric_limits<int>::max()) {
        throw wrongType(key, "an integer from -1 to 2147483647", field);
      }
      out = field.get<int>();
    };
    if (key == "method") {
      text(fault.method);
    } else if (key == "pathPrefix") {
      text(fault.pathPrefix);
    } else if (key == "watchOnly") {
      flag(fault.watchOnly);
    } else if (key == "bearerToken") {
      text(fault.bearerToken);
    } else if (key == "status") {
      number(fault.status);
    } else if (key == "retryAfterSeconds") {
      number(fault.retryAfterSeconds);
    } else if (key == "retryAfterHttpDate") {
      flag(fault.retryAfterHttpDate);
    } else if (key == "retryAfterRaw") {
      text(fault.retryAfterRaw);
    } else if (key == "latencyMs") {
      number(fault.latencyMs);
    } else if (key == "dropConnection") {
      flag(fault.dropConnection);
    } else if (key == "mode") {
      std::string name;
      text(name);
      fault.mode = ParseFaultMode(name);
    } else if (key == "count") {
      number(fault.count);
    } else if (key == "skip") {
      number(fault.skip);
    } else {
      throw std::invalid_argument("unknown fault field \"" + key + "\"");
    }
  }
  return fault;
}

json Fault::ToJson() const {
  return {{"method", method},
          {"pathPrefix", pathPrefix},
          {"watchOnly", watchOnly},
          {"bearerToken", bearerToken},
          {"status", status},
          {"retryAfterSeconds", retryAfterSeconds},
          {"retryAfterHttpDate", retryAfterHttpDate},
          {"retryAfterRaw", retryAfterRaw},
          {"latencyMs", latencyMs},
          {"dropConnection", dropConnection},
          {"mode", std::string(FaultModeName(mode))},
          {"count", count},
          {"skip", skip}};
}

json LoggedRequest::ToJson() const {
  return {{"method", method},           {"path", path},     {"query", query},
          {"contentType", contentType}, {"accept", accept}, {"body", body},
          {"bearerToken", bearerToken}, {"status", status}, {"fault", fault},
          {"bytesSent", bytesSent}};
}

FakeApiServer::FakeApiServer(FakeApiServerOptions options) : options_(std::move(options)) {
  RegisterBuiltins();
  {
    // The namespaces a real cluster has from the start (the API server's system namespaces
    // controller makes them); nothing else is made for a client.
    std::lock_guard lock(mutex_);
    auto namespaces = types_.at("/v1/namespaces");
    for (const char* name : kSystemNamespaces) {
      CreateLocked(*namespaces, "",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}},
                   false);
    }
  }
  for (const auto& path : options_.crdPaths) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        auto extension = entry.path().extension();
        if (extension == ".yaml" || extension == ".yml" || extension == ".json") {
          files.push_back(entry.path());
        }
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    for (const auto& file : files) {
      for (const auto& document : YamlFileToJson(file)) {
        if (document.value("kind", "") == "CustomResourceDefinition") LoadCrd(document);
      }
    }
  }
}

FakeApiServer::~FakeApiServer() { Stop(); }

void FakeApiServer::Start() {
  // A client that hangs up mid-answer (every endless mode ends so) must cost a failed write,
  // not the process: cpp-httplib sends without MSG_NOSIGNAL.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
  {
    std::lock_guard lock(mutex_);
    requestDelay_ = options_.requestDelay;
  }
  server_ = std::make_unique<httplib::Server>();
  // cpp-httplib serves a connection on one thread for its life, and a watch holds its
  // connection while it streams: the pool grows a thread whenever none is idle, up to
  // kMaxServerThreads, so two controllers and a fleet of agents fit (256+ watches).
  server_->new_task_queue = [] { return new GrowingPool(kMaxServerThreads); };
  server_->set_keep_alive_max_count(1000);
  // As Go's net/http (the real API server) does: without it an answer written in two pieces
  // waits for the client's delayed ACK, up to 200 ms per request on a kept-alive connection.
  server_->set_tcp_nodelay(true);
  auto handler = [this](const httplib::Request& request, httplib::Response& response) {
    Serve(request, response);
  };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  // cpp-httplib listens with a backlog of 5: a burst of connections (two hundred watches
  // opening at once) would wait for SYN retries, seconds each. Linux takes a second listen()
  // on the bound socket as a new backlog.
  auto listening = std::make_shared<int>(-1);
  server_->set_socket_options([listening](socket_t sock) {
    httplib::default_socket_options(sock);
    *listening = sock;
  });
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
  } else {
    port_ = server_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ > 0 && *listening >= 0) ::listen(*listening, 1024);
  if (port_ <= 0) {
    throw std::runtime_error("fake API server: cannot bind " + options_.host + ":" +
                             std::to_string(options_.port));
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void FakeApiServer::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

std::string FakeApiServer::url() const {
  return "http://" + options_.host + ":" + std::to_string(port_);
}

std::string FakeApiServer::Kubeconfig(const std::string& token) const {
  std::string text =
      "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
      "clusters:\n- name: fake\n  cluster:\n    server: " +
      url() +
      "\n"
      "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
      "users:\n- name: fake\n  user:\n";
  text += token.empty() ? "    {}\n" : "    token: " + token + "\n";
  return text;
}

void FakeApiServer::AddFault(const Fault& fault) {
  std::lock_guard lock(mutex_);
  faults_.push_back(fault);
}

void FakeApiServer::ClearFaults() {
  std::lock_guard lock(mutex_);
  faults_.clear();
}

void FakeApiServer::SetRequestDelay(std::chrono::milliseconds delay) {
  std::lock_guard lock(mutex_);
  requestDelay_ = std::max(delay, std::chrono::milliseconds(0));
}

std::chrono::milliseconds FakeApiServer::RequestDelay() const {
  std::lock_guard lock(mutex_);
  return requestDelay_;
}

void FakeApiServer::WaitUnlessStopping(std::chrono::milliseconds delay) {
  if (delay <= std::chrono::milliseconds(0)) return;
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, delay, [this] { return stopping_; });
}

std::vector<LoggedRequest> FakeApiServer::Requests() const {
  std::lock_guard lock(mutex_);
  return log_;
}

void FakeApiServer::ClearRequests() {
  std::lock_guard lock(mutex_);
  log_.clear();
}

void FakeApiServer::SetAcceptedTokens(std::set<std::string> tokens) {
  std::lock_guard lock(mutex_);
  acceptedTokens_ = std::move(tokens);
}

void FakeApiServer::DropWatches() {
  std::lock_guard lock(mutex_);
  ++dropGeneration_;
  changed_.notify_all();
}

void FakeApiServer::ExpireWatches() {
  std::lock_guard lock(mutex_);
  ++expireGeneration_;
  compactedThrough_ = resourceVersion_;
  history_.clear();
  changed_.notify_all();
}

void FakeApiServer::Compact() {
  std::lock_guard lock(mutex_);
  compactedThrough_ = resourceVersion_;
  history_.clear();
}

bool FakeApiServer::HandleControl(const httplib::Request& request, httplib::Response& response) {
  const std::string& path = request.path;
  const std::string& method = request.method;
  try {
    if (path == "/_fake/requests" && method == "GET") {
      json list = json::array();
      for (const auto& entry : Requests()) list.push_back(entry.ToJson());
      SendJson(response, 200, list);
    } else if (path == "/_fake/requests" && method == "DELETE") {
      ClearRequests();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/faults" && method == "POST") {
      AddFault(Fault::FromJson(json::parse(request.body)));
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/faults" && method == "DELETE") {
      ClearFaults();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/faults" && method == "GET") {
      std::lock_guard lock(mutex_);
      json list = json::array();
      for (const auto& fault : faults_) list.push_back(fault.ToJson());
      SendJson(response, 200, list);
    } else if (path == "/_fake/delay" && method == "PUT") {
      json body = json::parse(request.body);
      const auto ms = body.find("ms");
      if (!body.is_object() || ms == body.end() || !ms->is_number_integer() ||
          ms->get<int64_t>() < 0 || ms->get<int64_t>() > std::numeric_limits<int>::max()) {
        throw std::invalid_argument("the delay is {\"ms\": a non-negative integer}");
      }
      SetRequestDelay(std::chrono::milliseconds(ms->get<int64_t>()));
      SendJson(response, 200, {{"ms", RequestDelay().count()}});
    } else if (path == "/_fake/delay" && method == "GET") {
      SendJson(response, 200, {{"ms", RequestDelay().count()}});
    } else if (path == "/_fake/watches/drop" && method == "POST") {
      DropWatches();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/watches/expire" && method == "POST") {
      ExpireWatches();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/compact" && method == "POST") {
      Compact();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/tokens" && method == "PUT") {
      json body = json::parse(request.body);
      SetAcceptedTokens(body.value("accepted", std::set<std::string>{}));
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/users" && method == "PUT") {
      // {"token": "...", "user": {"username", "uid", "groups", "extra"}}
      json body = json::parse(request.body);
      if (!body.is_object() || !body.contains("token") || !body["token"].is_string()) {
        throw std::invalid_argument("a user is {\"token\": a string, \"user\": {...}}");
      }
      SetUser(body["token"].get<std::string>(),
              UserInfo::FromJson(body.value("user", json::object())));
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/service-endpoints" && method == "PUT") {
      // {"namespace", "name", "port", "host" (default 127.0.0.1)}
      json body = json::parse(request.body);
      if (!body.is_object() || !body.value("namespace", json()).is_string() ||
          !body.value("name", json()).is_string() ||
          !body.value("port", json()).is_number_integer()) {
        throw std::invalid_argument(
            "a service endpoint is {\"namespace\", \"name\", \"port\", \"host\"?}");
      }
      SetServiceEndpoint(body["namespace"].get<std::string>(), body["name"].get<std::string>(),
                         body["port"].get<int>(), body.value("host", "127.0.0.1"));
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/virt-api-mutator" && method == "PUT") {
      json body = json::parse(request.body);
      if (!body.is_object() || !body.value("enabled", json()).is_boolean()) {
        throw std::invalid_argument("the virt-api stand-in is {\"enabled\": true or false}");
      }
      EnableVirtApiMutator(body["enabled"].get<bool>());
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/seed" && method == "POST") {
      SendJson(response, 201, Seed(json::parse(request.body)));
    } else {
      SendJson(response, 404, {{"error", "unknown control endpoint " + method + " " + path}});
    }
  } catch (const std::exception& error) {
    SendJson(response, 400, {{"error", error.what()}});
  }
  return true;
}

void FakeApiServer::Serve(const httplib::Request& request, httplib::Response& response) {
  if (request.path.rfind("/_fake/", 0) == 0) {
    HandleControl(request, response);
    return;
  }
  LoggedRequest entry;
  entry.received = std::chrono::steady_clock::now();
  entry.method = request.method;
  entry.path = request.path;
  if (auto mark = request.target.find('?'); mark != std::string::npos) {
    entry.query = PercentDecode(request.target.substr(mark + 1));
  }
  entry.contentType = request.get_header_value("Content-Type");
  entry.accept = request.get_header_value("Accept");
  entry.body = request.body;
  std::string authorization = request.get_header_value("Authorization");
  if (authorization.rfind("Bearer ", 0) == 0) entry.bearerToken = authorization.substr(7);
  size_t logIndex = 0;
  std::optional<Fault> fault;
  bool authorized = true;
  std::chrono::milliseconds delay{0};
  const bool isWatch = ParamTrue(request, "watch");
  {
    std::lock_guard lock(mutex_);
    logIndex = log_.size();
    log_.push_back(entry);
    authorized = acceptedTokens_.empty() || acceptedTokens_.count(entry.bearerToken) > 0;
    delay = requestDelay_;
    for (auto it = faults_.begin(); it != faults_.end(); ++it) {
      if (it->count == 0) continue;
      // List and watch modes are taken where the list or the watch is answered.
      if (IsListMode(it->mode) || IsWatchMode(it->mode)) continue;
      if (it->mode == FaultMode::kEndlessBody && isWatch) continue;
      if (!it->method.empty() && it->method != request.method) continue;
      if (!it->pathPrefix.empty() && request.path.rfind(it->pathPrefix, 0) != 0) continue;
      if (it->watchOnly && !isWatch) continue;
      if (!it->bearerToken.empty() && it->bearerToken != entry.bearerToken) continue;
      if (it->skip > 0) {
        --it->skip;
        continue;
      }
      fault = *it;
      if (it->count > 0) --it->count;
      break;
    }
    if (fault) {
      log_[logIndex].fault = fault->mode != FaultMode::kNone
                                 ? std::string(FaultModeName(fault->mode))
                             : fault->dropConnection ? "drop"
                             : fault->status > 0     ? "status"
                                                     : "";
    }
  }
  auto finish = [this, logIndex](int status) {
    std::lock_guard lock(mutex_);
    if (logIndex < log_.size()) log_[logIndex].status = status;
  };
  // A brownout and a fault's latency add up; both end early when the server stops.
  WaitUnlessStopping(delay + std::chrono::milliseconds(fault ? fault->latencyMs : 0));
  if (fault && fault->dropConnection) {
    // Headers promise a body that never comes: the client sees the connection cut.
    response.status = 200;
    response.set_content_provider(1024, "application/json",
                                  [](size_t, size_t, httplib::DataSink&) { return false; });
    finish(-1);
    return;
  }
  if (fault &&
      (fault->mode == FaultMode::kEndlessBody || fault->mode == FaultMode::kEndlessString)) {
    SendEndless(request, response, fault->mode, logIndex);
    finish(200);
    return;
  }
  if (fault && fault->status > 0) {
    int code = fault->status;
    if (!fault->retryAfterRaw.empty()) {
      response.set_header("Retry-After", fault->retryAfterRaw);
    } else if (fault->retryAfterSeconds >= 0 && fault->retryAfterHttpDate) {
      response.set_header("Retry-After", HttpDate(std::chrono::system_clock::now() +
                                                  std::chrono::seconds(fault->retryAfterSeconds)));
    } else if (fault->retryAfterSeconds >= 0) {
      response.set_header("Retry-After", std::to_string(fault->retryAfterSeconds));
    }
    if (code == 429) {
      // API Priority and Fairness answers in plain text, not with a Status.
      response.status = 429;
      response.set_content("Too many requests, please try again later.\n",
                           "text/plain; charset=utf-8");
    } else {
      // The Status reason the API server gives each code (metav1.StatusReason), so a client
      // that reads the reason before the code classifies an injected answer as a real one.
      static const std::map<int, std::string> kReasons = {
          {401, "Unauthorized"}, {403, "Forbidden"}, {404, "NotFound"},           {409, "Conflict"},
          {410, "Expired"},      {422, "Invalid"},   {503, "ServiceUnavailable"}, {504, "Timeout"}};
      auto known = kReasons.find(code);
      std::string reason = known != kReasons.end() ? known->second
                           : code >= 500           ? "InternalError"
                                                   : "BadRequest";
      json details = json::object();
      if (fault->retryAfterSeconds > 0) details["retryAfterSeconds"] = fault->retryAfterSeconds;
      SendJson(response, code, StatusBody(code, reason, "injected fault", details));
    }
    finish(code);
    return;
  }
  if (!authorized) {
    SendJson(response, 401, StatusBody(401, "Unauthorized", "Unauthorized", json::object()));
    finish(401);
    return;
  }
  try {
    Outcome outcome = Dispatch(request, response, logIndex);
    finish(outcome.status);
  } catch (const StatusError& error) {
    SendJson(response, error.code,
             StatusBody(error.code, error.reason, error.message, error.details));
    finish(error.code);
  } catch (const std::exception& error) {
    SendJson(response, 500, StatusBody(500, "InternalError", error.what(), json::object()));
    finish(500);
  }
}

std::optional<Fault> FakeApiServer::TakeModeFault(const httplib::Request& request, bool listModes,
                                                  size_t logIndex) {
  std::optional<Fault> taken;
  {
    std::lock_guard lock(mutex_);
    const bool isWatch = ParamTrue(request, "watch");
    const std::string authorization = request.get_header_value("Authorization");
    const std::string token =
        authorization.rfind("Bearer ", 0) == 0 ? authorization.substr(7) : std::string();
    for (auto& fault : faults_) {
      if (fault.count == 0) continue;
      if (listModes ? !IsListMode(fault.mode) : !IsWatchMode(fault.mode)) continue;
      if (!fault.method.empty() && fault.method != request.method) continue;
      if (!fault.pathPrefix.empty() && request.path.rfind(fault.pathPrefix, 0) != 0) continue;
      if (fault.watchOnly && !isWatch) continue;
      if (!fault.bearerToken.empty() && fault.bearerToken != token) continue;
      if (fault.skip > 0) {
        --fault.skip;
        continue;
      }
      taken = fault;
      if (fault.count > 0) --fault.count;
      if (logIndex < log_.size()) log_[logIndex].fault = std::string(FaultModeName(fault.mode));
      break;
    }
  }
  if (taken) WaitUnlessStopping(std::chrono::milliseconds(taken->latencyMs));
  return taken;
}

void FakeApiServer::SendEndless(const httplib::Request& request, httplib::Response& response,
                                FaultMode mode, size_t logIndex) {
  const bool isWatch = ParamTrue(request, "watch");
  std::string prefix;
  if (isWatch) {
    prefix = R"({"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":")";
  } else {
    prefix = R"({"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":")" +
             CurrentResourceVersion() + R"("},"items":[{"metadata":{"name":")";
  }
  if (mode == FaultMode::kEndlessBody) {
    // Blanks inside the list: valid JSON as far as it goes, and no end in sight.
    prefix.resize(prefix.size() - std::string(R"({"metadata":{"name":")").size());
  }
  const auto deadline = std::chrono::steady_clock::now() + kEndlessFor;
  const std::string filler(64 * 1024, mode == FaultMode::kEndlessBody ? ' ' : 'a');
  // One chunk per call, the prefix first; false (the connection is closed) once the client
  // is gone, the time is up or the server stops.
  auto produce = [this, prefix, filler, deadline, logIndex](uint64_t offset, uint64_t limit,
                                                            httplib::DataSink& sink) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::string_view chunk = offset == 0 ? std::string_view(prefix) : std::string_view(filler);
    if (chunk.size() > limit) chunk = chunk.substr(0, limit);
    if (!sink.write(chunk.data(), chunk.size())) return false;
    std::lock_guard lock(mutex_);
    if (logIndex < log_.size()) log_[logIndex].bytesSent += chunk.size();
    return true;
  };
  response.status = 200;
  if (mode == FaultMode::kEndlessBody) {
    response.set_content_provider(kEndlessBodyBytes, "application/json",
                                  [produce](size_t offset, size_t length, httplib::DataSink& sink) {
                                    return produce(offset, length, sink);
                                  });
  } else {
    StreamUncompressed(request);
    response.set_chunked_content_provider(
        "application/json", [produce](size_t offset, httplib::DataSink& sink) {
          return produce(offset, std::numeric_limits<uint64_t>::max(), sink);
        });
  }
}

}  // namespace cozy::fake
