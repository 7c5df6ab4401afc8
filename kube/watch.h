// One watch request as a non-blocking stream: libcurl's multi interface underneath, so the
// owner decides when to wait. An event loop registers Fds() and calls Perform() when one is
// ready or Timeout() has passed; a thread of its own can call Poll() instead.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/clock.h"
#include "kube/errors.h"
#include "kube/json_stream.h"

struct curl_slist;  // libcurl's, kept out of this header

namespace cozy::kube {

class Client;

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  nlohmann::json object;
  // `object` is only a stub of metadata (SkimEvent): the object has no key the watch's skim
  // wants, so its consumer does not keep it (WatchOptions::skim).
  bool skimmed = false;
};

class WatchStream {
 public:
  struct Fd {
    int fd;
    bool read;
    bool write;
  };

  ~WatchStream();
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  // Sockets to wait on now; they can change after each Perform().
  std::vector<Fd> Fds();
  // Longest wait before Perform() must run even without socket activity.
  Duration Timeout();
  // Moves the transfer on and decodes every complete event. Never blocks.
  void Perform();
  // Waits up to `maxWait` for socket activity (poll(2)), then performs.
  void Poll(Duration maxWait);

  // Events decoded so far, oldest first.
  std::vector<WatchEvent> TakeEvents();
  // The stream has ended: the server closed it (its timeout, a drop) or it failed.
  bool Done() const { return done_; }
  // Why it ended, when not cleanly: a transport error, a non-200 answer, or kBadResponse for
  // a stream this client cannot read on (the transfer is stopped at the first such frame;
  // the events before it are still there to take):
  //  - a frame that is not JSON, or longer than ClientOptions::maxWatchEventBytes, or
  //    nested deeper than kMaxJsonDepth;
  //  - an event that is not an object, whose `type` is not one of ADDED, MODIFIED,
  //    DELETED, BOOKMARK, ERROR, or whose `object` is not an object.
  // The message names the event by its number in the stream: "event 3 (ADDED): object is a
  // string, not an object". What is inside `object` is the owner's to check.
  const std::optional<ApiError>& Error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  friend class Client;
  WatchStream(Client& client, std::string path, const std::string& url, long timeoutMs);
  void Finish(int curlCode);
  bool Decode(const std::string& text);
  void StopDecoding(const std::string& why);
  static size_t OnData(char* data, size_t size, size_t count, void* self);
  static size_t OnHeader(char* data, size_t size, size_t count, void* self);

  Client& client_;
  std::string path_;
  void* multi_ = nullptr;  // CURLM*
  void* easy_ = nullptr;   // CURL*
  curl_slist* headers_ = nullptr;
  char errorBuffer_[256] = {};
  JsonStreamSplitter splitter_;
  std::deque<WatchEvent> events_;
  std::string errorBody_;
  std::string contentType_;
  std::string retryAfter_;
  long httpStatus_ = 0;
  bool done_ = false;
  size_t frames_ = 0;  // values cut from the stream so far
  std::optional<ApiError> decodeError_;
  SkimWants skim_;  // WatchOptions::skim
  std::optional<ApiError> error_;
};

}  // namespace cozy::kube
