#include "kube/watch.h"

#include <curl/curl.h>
#include <poll.h>

#include <algorithm>

#include "kube/client.h"

namespace cozy::kube {
using nlohmann::json;

WatchStream::WatchStream(Client& client, std::string path, const std::string& url, long timeoutMs)
    : client_(client), path_(std::move(path)), splitter_(client.options().maxWatchEventBytes) {
  easy_ = client_.NewConfiguredHandle(url, &headers_, "application/json");
  curl_easy_setopt(easy_, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(easy_, CURLOPT_HTTPHEADER, headers_);
  curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, errorBuffer_);
  curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &WatchStream::OnData);
  curl_easy_setopt(easy_, CURLOPT_WRITEDATA, this);
  curl_easy_setopt(easy_, CURLOPT_HEADERFUNCTION, &WatchStream::OnHeader);
  curl_easy_setopt(easy_, CURLOPT_HEADERDATA, this);
  if (timeoutMs > 0) curl_easy_setopt(easy_, CURLOPT_TIMEOUT_MS, timeoutMs);
  multi_ = curl_multi_init();
  curl_multi_add_handle(multi_, easy_);
  Perform();  // starts connecting
}

WatchStream::~WatchStream() {
  if (multi_) {
    curl_multi_remove_handle(multi_, easy_);
    curl_multi_cleanup(multi_);
  }
  // Not returned to the client's pool: its connection carries a half-read stream.
  if (easy_) curl_easy_cleanup(easy_);
  curl_slist_free_all(headers_);
}

size_t WatchStream::OnHeader(char* data, size_t size, size_t count, void* self) {
  auto* stream = static_cast<WatchStream*>(self);
  std::string_view line(data, size * count);
  if (line.size() > 12) {
    std::string name(line.substr(0, 12));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name == "retry-after:") stream->retryAfter_ = std::string(line.substr(12));
  }
  return size * count;
}

size_t WatchStream::OnData(char* data, size_t size, size_t count, void* self) {
  auto* stream = static_cast<WatchStream*>(self);
  size_t bytes = size * count;
  if (stream->httpStatus_ == 0) {
    curl_easy_getinfo(stream->easy_, CURLINFO_RESPONSE_CODE, &stream->httpStatus_);
  }
  if (stream->httpStatus_ != 200) {
    // An error answer instead of a stream (e.g. 429, 5xx, a plain 404): keep its start for
    // the error and stop reading there; an endless error body costs nothing more.
    constexpr size_t kErrorBodyCap = 64 * 1024;
    stream->errorBody_.append(data, std::min(bytes, kErrorBodyCap - stream->errorBody_.size()));
    if (stream->errorBody_.size() < kErrorBodyCap) return bytes;
    return 0;
  }
  if (stream->decodeError_) return 0;
  stream->splitter_.Feed(std::string_view(data, bytes));
  while (auto text = stream->splitter_.Next()) {
    if (!stream->Decode(*text)) return 0;  // aborts the transfer: Finish reports why
  }
  if (stream->splitter_.Failed()) {
    stream->StopDecoding("event " + std::to_string(stream->frames_ + 1) + ": " +
                         stream->splitter_.Error());
    return 0;
  }
  return bytes;
}

void WatchStream::StopDecoding(const std::string& why) {
  decodeError_.emplace(ErrorKind::kBadResponse, 200, "", why, "GET", path_);
}

bool WatchStream::Decode(const std::string& text) {
  ++frames_;
  if (skim_) {
    if (std::optional<SkimmedEvent> skimmed = SkimEvent(text, skim_)) {
      events_.push_back({std::move(skimmed->type), std::move(skimmed->stub), true});
      return true;
    }
  }
  // Named only in an error: each event would pay for the string.
  const auto name = [this] { return "event " + std::to_string(frames_); };
  std::string problem;
  json value = ParseNetworkJson(text, problem);
  if (!problem.empty()) {
    StopDecoding(name() + " " + problem);
    return false;
  }
  if (!value.is_object()) {
    StopDecoding(name() + " is " + JsonTypeName(value) + ", not an object");
    return false;
  }
  const auto type = value.find("type");
  if (type == value.end()) {
    StopDecoding(name() + " has no type");
    return false;
  }
  if (!type->is_string()) {
    StopDecoding(name() + ": type is " + JsonTypeName(*type) + ", not a string");
    return false;
  }
  const std::string typeName = type->get<std::string>();
  if (typeName != "ADDED" && typeName != "MODIFIED" && typeName != "DELETED" &&
      typeName != "BOOKMARK" && typeName != "ERROR") {
    StopDecoding(name() + ": unknown type \"" + typeName.substr(0, 64) + "\"");
    return false;
  }
  auto object = value.find("object");
  if (object == value.end()) {
    StopDecoding(name() + " (" + typeName + ") has no object");
    return false;
  }
  if (!object->is_object()) {
    StopDecoding(name() + " (" + typeName + "): object is " + JsonTypeName(*object) +
                 ", not an object");
    return false;
  }
  events_.push_back({typeName, std::move(*object)});
  return true;
}

std::vector<WatchStream::Fd> WatchStream::Fds() {
  std::vector<Fd> fds;
  if (done_) return fds;
  fd_set readSet, writeSet, errorSet;
  FD_ZERO(&readSet);
  FD_ZERO(&writeSet);
  FD_ZERO(&errorSet);
  int maxFd = -1;
  curl_multi_fdset(multi_, &readSet, &writeSet, &errorSet, &maxFd);
  for (int fd = 0; fd <= maxFd; ++fd) {
    bool read = FD_ISSET(fd, &readSet);
    bool write = FD_ISSET(fd, &writeSet);
    if (read || write) fds.push_back({fd, read, write});
  }
  return fds;
}

Duration WatchStream::Timeout() {
  if (done_) return Duration::zero();
  long timeoutMs = -1;
  curl_multi_timeout(multi_, &timeoutMs);
  // -1: curl has no timer set; the sockets alone wake us. Come back within a second anyway,
  // as curl's own docs advise for a connection in progress.
  if (timeoutMs < 0) timeoutMs = 1000;
  return std::chrono::milliseconds(timeoutMs);
}

void WatchStream::Perform() {
  if (done_) return;
  int running = 0;
  curl_multi_perform(multi_, &running);
  int queued = 0;
  while (CURLMsg* message = curl_multi_info_read(multi_, &queued)) {
    if (message->msg == CURLMSG_DONE) Finish(message->data.result);
  }
}

void WatchStream::Poll(Duration maxWait) {
  if (done_) return;
  std::vector<pollfd> polls;
  for (const Fd& fd : Fds()) {
    short events = 0;
    if (fd.read) events |= POLLIN;
    if (fd.write) events |= POLLOUT;
    polls.push_back({fd.fd, events, 0});
  }
  Duration wait = std::min(maxWait, Timeout());
  auto waitMs = std::chrono::duration_cast<std::chrono::milliseconds>(wait).count();
  if (polls.empty()) {
    // Nothing to wait on yet (resolving, or between connection attempts): curl's timer is it.
    poll(nullptr, 0, static_cast<int>(std::min<long long>(waitMs, 50)));
  } else {
    poll(polls.data(), polls.size(), static_cast<int>(waitMs));
  }
  Perform();
}

void WatchStream::Finish(int curlCode) {
  done_ = true;
  auto code = static_cast<CURLcode>(curlCode);
  if (decodeError_) {
    error_ = decodeError_;
    return;
  }
  if (httpStatus_ == 0) curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &httpStatus_);
  if (httpStatus_ != 0 && httpStatus_ != 200) {
    char* type = nullptr;
    curl_easy_getinfo(easy_, CURLINFO_CONTENT_TYPE, &type);
    error_ = ErrorFromResponse(static_cast<int>(httpStatus_), type ? type : "", errorBody_,
                               retryAfter_, "GET", path_);
    if (error_->kind() == ErrorKind::kUnauthorized) client_.tokens().Invalidate();
    return;
  }
  // The server's timeout ends a stream cleanly; a reset or our own guard timeout does not,
  // but either way the owner re-watches from the last resourceVersion.
  if (code != CURLE_OK) {
    error_.emplace(ErrorKind::kTransport, 0, "",
                   errorBuffer_[0] ? errorBuffer_ : curl_easy_strerror(code), "GET", path_);
  }
}

std::vector<WatchEvent> WatchStream::TakeEvents() {
  std::vector<WatchEvent> events(std::make_move_iterator(events_.begin()),
                                 std::make_move_iterator(events_.end()));
  events_.clear();
  return events;
}

}  // namespace cozy::kube
