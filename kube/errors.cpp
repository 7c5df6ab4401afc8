#include "kube/errors.h"

#include "kube/json_stream.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>

#include <nlohmann/json.hpp>

namespace cozy::kube {

std::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kTransport:
      return "Transport";
    case ErrorKind::kNotFound:
      return "NotFound";
    case ErrorKind::kResourceNotServed:
      return "ResourceNotServed";
    case ErrorKind::kAlreadyExists:
      return "AlreadyExists";
    case ErrorKind::kConflict:
      return "Conflict";
    case ErrorKind::kInvalid:
      return "Invalid";
    case ErrorKind::kExpired:
      return "Expired";
    case ErrorKind::kTooManyRequests:
      return "TooManyRequests";
    case ErrorKind::kUnauthorized:
      return "Unauthorized";
    case ErrorKind::kForbidden:
      return "Forbidden";
    case ErrorKind::kBadRequest:
      return "BadRequest";
    case ErrorKind::kUnsupportedMediaType:
      return "UnsupportedMediaType";
    case ErrorKind::kServerError:
      return "ServerError";
    case ErrorKind::kBadResponse:
      return "BadResponse";
    case ErrorKind::kDeadlineExceeded:
      return "DeadlineExceeded";
    case ErrorKind::kOther:
      return "Other";
  }
  return "Other";
}

namespace {

std::string Describe(ErrorKind kind, int httpStatus, const std::string& message,
                     const std::string& method, const std::string& path) {
  std::string text = method + " " + path + ": ";
  if (httpStatus > 0) text += "HTTP " + std::to_string(httpStatus) + " ";
  text += std::string(ErrorKindName(kind));
  if (!message.empty()) text += ": " + message;
  return text;
}

}  // namespace

ApiError::ApiError(ErrorKind kind, int httpStatus, std::string reason, std::string message,
                   std::string method, std::string path,
                   std::optional<std::chrono::seconds> retryAfter)
    : std::runtime_error(Describe(kind, httpStatus, message, method, path)),
      kind_(kind),
      httpStatus_(httpStatus),
      reason_(std::move(reason)),
      message_(std::move(message)),
      method_(std::move(method)),
      path_(std::move(path)),
      retryAfter_(retryAfter) {}

bool ApiError::IsTransient() const {
  switch (kind_) {
    case ErrorKind::kTransport:
    case ErrorKind::kTooManyRequests:
    case ErrorKind::kServerError:
    case ErrorKind::kResourceNotServed:
    case ErrorKind::kUnauthorized:
    case ErrorKind::kBadResponse:
      return true;
    default:
      return false;
  }
}

std::optional<std::chrono::seconds> ParseRetryAfter(std::string_view value,
                                                    std::chrono::system_clock::time_point now) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!value.empty() && blank(value.front())) value.remove_prefix(1);
  while (!value.empty() && blank(value.back())) value.remove_suffix(1);
  if (value.empty()) return std::nullopt;
  const char* end = value.data() + value.size();
  if (std::isdigit(static_cast<unsigned char>(value.front()))) {
    // delay-seconds: 1*DIGIT. More digits than a long holds is a very long wait: the cap.
    long long seconds = 0;
    auto [stop, error] = std::from_chars(value.data(), end, seconds);
    if (stop != end) return std::nullopt;
    if (error == std::errc::result_out_of_range) return kMaxRetryAfter;
    if (error != std::errc()) return std::nullopt;
    return std::chrono::seconds(std::min<long long>(seconds, kMaxRetryAfter.count()));
  }
  // An HTTP-date starts with a day name in each of its three forms; a sign, a fraction or
  // words are not a Retry-After at all (curl_getdate would make a date of some of them).
  if (!std::isalpha(static_cast<unsigned char>(value.front()))) return std::nullopt;
  const std::string text(value);
  const time_t when = curl_getdate(text.c_str(), nullptr);
  if (when == -1) return std::nullopt;
  const auto delta = std::chrono::system_clock::from_time_t(when) - now;
  // A date already past (or a server clock behind ours) says nothing useful: ignored.
  if (delta < std::chrono::seconds(0)) return std::nullopt;
  auto seconds = std::chrono::ceil<std::chrono::seconds>(delta);
  return std::min(seconds, kMaxRetryAfter);
}

ErrorKind ErrorKindFromStatus(int code, std::string_view reason) {
  if (reason == "NotFound") return ErrorKind::kNotFound;
  if (reason == "AlreadyExists") return ErrorKind::kAlreadyExists;
  if (reason == "Conflict") return ErrorKind::kConflict;
  if (reason == "Invalid") return ErrorKind::kInvalid;
  if (reason == "Expired" || reason == "Gone") return ErrorKind::kExpired;
  if (reason == "TooManyRequests") return ErrorKind::kTooManyRequests;
  if (reason == "Unauthorized") return ErrorKind::kUnauthorized;
  if (reason == "Forbidden") return ErrorKind::kForbidden;
  if (reason == "BadRequest") return ErrorKind::kBadRequest;
  if (reason == "UnsupportedMediaType") return ErrorKind::kUnsupportedMediaType;
  switch (code) {
    case 400:
      return ErrorKind::kBadRequest;
    case 401:
      return ErrorKind::kUnauthorized;
    case 403:
      return ErrorKind::kForbidden;
    case 404:
      return ErrorKind::kNotFound;
    case 409:
      return ErrorKind::kConflict;
    case 410:
      return ErrorKind::kExpired;
    case 415:
      return ErrorKind::kUnsupportedMediaType;
    case 422:
      return ErrorKind::kInvalid;
    case 429:
      return ErrorKind::kTooManyRequests;
    default:
      break;
  }
  if (code >= 500 && code <= 599) return ErrorKind::kServerError;
  return ErrorKind::kOther;
}

ApiError ErrorFromResponse(int httpStatus, std::string_view contentType, std::string_view body,
                           std::string_view retryAfterHeader, std::string method,
                           std::string path) {
  auto retryAfter = ParseRetryAfter(retryAfterHeader);
  nlohmann::json status;
  bool isStatus = false;
  if (contentType.find("json") != std::string_view::npos) {
    status = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    isStatus = status.is_object() && StringField(status, "kind") == "Status";
  }
  if (!isStatus) {
    // No Status body. A 404 like this is the end of the apiserver's handler chain: the kind
    // is not served at all (research §3), which is not the same as a missing object.
    std::string text(body.substr(0, 200));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    ErrorKind kind =
        httpStatus == 404 ? ErrorKind::kResourceNotServed : ErrorKindFromStatus(httpStatus, "");
    return ApiError(kind, httpStatus, "", text, std::move(method), std::move(path), retryAfter);
  }
  std::string reason = StringField(status, "reason");
  std::string message = StringField(status, "message");
  if (!retryAfter && status.contains("details") && status["details"].is_object()) {
    const auto& details = status["details"];
    const auto seconds = details.find("retryAfterSeconds");
    if (seconds != details.end() && seconds->is_number_unsigned()) {
      // A server's int32; anything bigger is still only as long as the cap.
      const uint64_t value =
          std::min(seconds->get<uint64_t>(), static_cast<uint64_t>(kMaxRetryAfter.count()));
      retryAfter = std::chrono::seconds(static_cast<std::chrono::seconds::rep>(value));
      if (*retryAfter == std::chrono::seconds(0)) retryAfter.reset();
    }
  }
  ErrorKind kind = ErrorKindFromStatus(httpStatus, reason);
  if (httpStatus >= 500) kind = ErrorKind::kServerError;
  // A real missing object always names itself in details.name; a NotFound Status without it
  // is a client library's stand-in for the plain 404 (research §3), so it is the kind.
  if (kind == ErrorKind::kNotFound &&
      !(status.contains("details") && status["details"].is_object() &&
        status["details"].contains("name"))) {
    kind = ErrorKind::kResourceNotServed;
  }
  return ApiError(kind, httpStatus, reason, message, std::move(method), std::move(path),
                  retryAfter);
}

}  // namespace cozy::kube
