// Typed errors of the Kubernetes API: what went wrong, decided once from the HTTP status, the
// Content-Type and the `Status` body (research §3), so callers switch on a kind, not on text.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cozy::kube {

enum class ErrorKind {
  kTransport,             // no HTTP answer: connection refused or reset, timeout, TLS failure
  kNotFound,              // 404 with a JSON Status: the object does not exist
  kResourceNotServed,     // 404 without a Status (plain "404 page not found"): the kind is not
                          // served, e.g. its CRD is not installed yet
  kAlreadyExists,         // 409 reason AlreadyExists
  kConflict,              // 409 reason Conflict: stale resourceVersion
  kInvalid,               // 422
  kExpired,               // 410 Gone / Expired (also a watch's ERROR event)
  kTooManyRequests,       // 429
  kUnauthorized,          // 401
  kForbidden,             // 403
  kBadRequest,            // 400
  kUnsupportedMediaType,  // 415
  kServerError,           // 5xx
  kBadResponse,           // an answer the client cannot use: not JSON, over the size cap,
                          // or not the shape the API promises (a list whose items is not an
                          // array, a watch event without metadata, a numeric resourceVersion)
  kDeadlineExceeded,      // not sent: the call's deadline (RequestOptions) had passed, or
                          // its DeadlineSource allowed no attempt (a leader no longer leading)
  kOther,                 // any other non-2xx
};

std::string_view ErrorKindName(ErrorKind kind);

class ApiError : public std::runtime_error {
 public:
  ApiError(ErrorKind kind, int httpStatus, std::string reason, std::string message,
           std::string method, std::string path,
           std::optional<std::chrono::seconds> retryAfter = std::nullopt);

  ErrorKind kind() const { return kind_; }
  int httpStatus() const { return httpStatus_; }           // 0 for transport errors
  const std::string& reason() const { return reason_; }    // Status.reason, may be empty
  const std::string& message() const { return message_; }  // Status.message or body text
  const std::string& method() const { return method_; }
  const std::string& path() const { return path_; }
  std::optional<std::chrono::seconds> retryAfter() const { return retryAfter_; }
  // A kBadResponse whose body passed ClientOptions::maxResponseBytes: the same request gets
  // the same body, but a list page of fewer objects may fit (Client::ListPages).
  bool responseTooLarge() const { return responseTooLarge_; }
  ApiError& MarkResponseTooLarge() {
    responseTooLarge_ = true;
    return *this;
  }

  // Worth trying again later unchanged: transport errors, 429, 5xx, an unserved kind (a CRD
  // may be installed later), 401 (a rotated token is re-read on the next request) and a bad
  // response (a server or proxy in trouble may answer properly later).
  bool IsTransient() const;

 private:
  ErrorKind kind_;
  int httpStatus_;
  std::string reason_;
  std::string message_;
  std::string method_;
  std::string path_;
  std::optional<std::chrono::seconds> retryAfter_;
  bool responseTooLarge_ = false;
};

// Retry-After is honoured up to this long: a server (or a proxy) asking for an hour, or a
// date far ahead, must not park a client for that long.
inline constexpr std::chrono::seconds kMaxRetryAfter{300};

// Builds the error for a non-2xx answer. `retryAfterHeader` is the raw header value (see
// ParseRetryAfter); a Status' details.retryAfterSeconds counts when there is no header.
ApiError ErrorFromResponse(int httpStatus, std::string_view contentType, std::string_view body,
                           std::string_view retryAfterHeader, std::string method, std::string path);

// ErrorKind for a Status object's reason and code (used for watch ERROR events too).
ErrorKind ErrorKindFromStatus(int code, std::string_view reason);

// A Retry-After header's wait (RFC 9110 §10.2.3): delay-seconds ("120") or an HTTP-date
// ("Wed, 21 Oct 2015 07:28:00 GMT"; also the obsolete RFC 850 and asctime forms), read with
// curl_getdate and counted from `now`. Clamped to kMaxRetryAfter. Nothing (ignored) for a
// negative number, a date already past, or anything else.
std::optional<std::chrono::seconds> ParseRetryAfter(
    std::string_view value,
    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

}  // namespace cozy::kube
