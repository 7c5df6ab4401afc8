#include "controller/webhook/server.h"

#include <stdexcept>
#include <utility>

#include "api/json_field.h"
#include "kube/json_stream.h"
#include "runtime/duration.h"
#include "runtime/log.h"

namespace cozy::controller::webhook {
namespace {

using runtime::LogFields;

runtime::HttpResponse Plain(int status, std::string body) {
  runtime::HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

// A denial with code 400 for a review that does not decode, carrying its uid when it has one
// (the API server matches the answer to its request by uid).
runtime::HttpResponse MalformedReview(const nlohmann::json& review, const std::string& message) {
  std::string uid;
  if (review.is_object()) {
    const auto request = review.find("request");
    if (request != review.end() && request->is_object()) {
      const auto found = request->find("uid");
      if (found != request->end() && found->is_string()) uid = found->get<std::string>();
    }
  }
  const nlohmann::json answer = {
      {"apiVersion", "admission.k8s.io/v1"},
      {"kind", "AdmissionReview"},
      {"response",
       {{"uid", uid}, {"allowed", false}, {"status", {{"code", 400}, {"message", message}}}}}};
  runtime::HttpResponse response;
  response.contentType = "application/json";
  response.body = answer.dump();
  return response;
}

}  // namespace

std::chrono::milliseconds RequestTimeout(const std::string& parameter) {
  if (auto parsed = runtime::ParseDuration(parameter); parsed && parsed->count() > 0) {
    return *parsed;
  }
  return std::chrono::seconds(10);
}

Server::Server(ServerOptions options) : options_(std::move(options)) {
  runtime::TlsOptions tls;
  tls.certDir = options_.certDir;
  tls.clientCaFile = options_.clientCaFile;
  tls.clientCaFlag = "--webhook-client-ca";
  tls_ = std::make_shared<runtime::TlsTransport>(std::move(tls));
}

Server::~Server() { Stop(); }

void Server::Handle(const std::string& path, Handler handler) {
  handlers_[path] = std::move(handler);
}

std::optional<Server::WaitSlot> Server::TryWait() {
  size_t now = waiting_.load();
  do {
    if (now >= options_.maxWaiting) return std::nullopt;
  } while (!waiting_.compare_exchange_weak(now, now + 1));
  return WaitSlot(waiting_);
}

Server::Stats Server::stats() const {
  Stats stats;
  {
    std::lock_guard lock(statsMutex_);
    stats = stats_;
  }
  const runtime::TlsTransport::Stats tls = tls_->stats();
  stats.certificateLoads = tls.certificateLoads;
  stats.certificateErrors = tls.certificateErrors;
  stats.certificateNotAfter = tls.certificateNotAfter;
  if (server_) stats.http = server_->stats();
  return stats;
}

bool Server::Saturated() const { return server_ && server_->Saturated(); }

void Server::Start() {
  tls_->LoadOrThrow();
  runtime::HttpLimits limits;
  limits.maxConnections = options_.maxConnections;
  limits.maxConnectionsPerPeer = options_.maxConnectionsPerPeer;
  limits.handshakeDeadline = options_.handshakeDeadline;
  limits.requestsPerConnection = options_.requestsPerConnection;
  limits.keepAliveIdle = options_.keepAliveIdle;
  limits.headerDeadline = options_.requestDeadline;
  limits.maxHeaderBytes = 16 * 1024;
  limits.maxBodyBytes = 0;  // GET routes: none here
  limits.workers = options_.threads;
  limits.queuedRequests = options_.queue;
  limits.maxBufferedBodyBytes = options_.maxBufferedBodyBytes;
  limits.handlerDeadline = options_.answerDeadline;
  server_ = std::make_unique<runtime::HttpServer>(limits);
  server_->UseTransport(tls_);
  for (const auto& [path, handler] : handlers_) {
    server_->HandlePost(
        path,
        [this, path = path, handler = handler](const runtime::HttpRequest& request) {
          {
            std::lock_guard lock(statsMutex_);
            ++stats_.requests;
            ++stats_.byPath[path];
          }
          auto fail = [&](int status, const std::string& why) {
            {
              std::lock_guard lock(statsMutex_);
              ++stats_.failures;
            }
            runtime::LogWarning(
                "admission request not answered",
                LogFields{{"path", path}, {"status", std::to_string(status)}, {"error", why}});
            return Plain(status, path + ": " + why + "\n");
          };
          std::string parseError;
          const nlohmann::json review = kube::ParseNetworkJson(request.body, parseError);
          if (!parseError.empty()) {
            return fail(400, "the body is not JSON: " + parseError);
          }
          // The API server stops waiting `timeout` after it sent the request, which is about
          // when the request began (the connection's accept, or its first byte on a kept
          // connection); the answer needs its way back.
          const auto timeout = RequestTimeout(request.QueryParameter("timeout"));
          const auto margin =
              std::min<std::chrono::milliseconds>(timeout / 10, std::chrono::seconds(1));
          RequestContext context{request.accepted + timeout - margin};
          try {
            runtime::HttpResponse response;
            response.contentType = "application/json";
            response.body = handler(review, context).dump();
            return response;
          } catch (const api::DecodeError& error) {
            // A malformed review (no request, no uid, a field of the wrong type): answered as
            // an AdmissionReview denying with code 400, which the API server shows as it is,
            // not as a failed call (docs/controller.md, "Admission webhooks").
            {
              std::lock_guard lock(statsMutex_);
              ++stats_.failures;
            }
            runtime::LogWarning("malformed admission review refused",
                                LogFields{{"path", path}, {"error", error.what()}});
            return MalformedReview(review,
                                   path + ": the AdmissionReview is malformed: " + error.what());
          } catch (const std::exception& error) {
            return fail(500, error.what());
          }
        },
        options_.maxBodyBytes);
  }
  if (!server_->Start(options_.address)) {
    const std::string error = server_->error();
    server_.reset();
    throw std::runtime_error("--webhook-addr: " + error);
  }
  port_ = server_->port();
  serving_ = true;
}

void Server::Drain() {
  if (server_) server_->Drain();
}

void Server::StopServing(std::chrono::milliseconds grace) {
  if (server_) server_->StopServing(grace);
  serving_ = false;
}

void Server::Stop() {
  if (server_) server_->Stop();
  serving_ = false;
}

}  // namespace cozy::controller::webhook
