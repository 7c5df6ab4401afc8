#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "podresources/fetch.h"

namespace cozy::podresources {

std::string_view ToString(FetchState state) {
  switch (state) {
    case FetchState::kOk:
      return "ok";
    case FetchState::kSocketAbsent:
      return "socketAbsent";
    case FetchState::kUnavailable:
      return "unavailable";
    case FetchState::kDeadlineExceeded:
      return "deadlineExceeded";
    case FetchState::kUnimplemented:
      return "unimplemented";
    case FetchState::kResourceExhausted:
      return "resourceExhausted";
    case FetchState::kMessageTooLarge:
      return "messageTooLarge";
    case FetchState::kOther:
      return "other";
  }
  return "other";
}

std::optional<std::string> UnixSocketPath(std::string_view endpoint) {
  constexpr std::string_view kAbsolute = "unix://";
  constexpr std::string_view kRelative = "unix:";
  if (endpoint.starts_with(kAbsolute)) {
    return std::string(endpoint.substr(kAbsolute.size()));
  }
  if (endpoint.starts_with(kRelative)) {
    return std::string(endpoint.substr(kRelative.size()));
  }
  return std::nullopt;
}

std::optional<FetchResult> SocketAbsent(const ClientOptions& options) {
  // gRPC would report a missing socket as UNAVAILABLE too; looking first tells "kubelet is not
  // there" from "kubelet does not accept" and names the path.
  const auto path = UnixSocketPath(options.endpoint);
  if (!path) {
    return std::nullopt;
  }
  struct stat info {};
  if (::stat(path->c_str(), &info) == 0) {
    return std::nullopt;
  }
  const int error = errno;
  FetchResult result;
  result.state = FetchState::kSocketAbsent;
  result.message = "pod-resources socket " + *path + ": " + std::strerror(error);
  return result;
}

}  // namespace cozy::podresources
