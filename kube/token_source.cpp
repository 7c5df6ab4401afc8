#include "kube/token_source.h"

#include <fstream>
#include <sstream>

namespace cozy::kube {

TokenSource::TokenSource(std::string token, std::string file, TimeSource& time)
    : fixed_(std::move(token)), file_(std::move(file)), time_(time) {}

std::string TokenSource::Token() {
  if (file_.empty()) return fixed_;
  std::lock_guard lock(mutex_);
  TimePoint now = time_.Now();
  if (valid_ && now - readAt_ < kMaxAge) return cached_;
  std::ifstream in(file_, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  std::string token = text.str();
  const char* space = " \t\r\n";
  auto first = token.find_first_not_of(space);
  token = first == std::string::npos
              ? std::string()
              : token.substr(first, token.find_last_not_of(space) - first + 1);
  if (!in || token.empty()) {
    lastError_ = "reading token file " + file_ + (in ? ": empty" : ": cannot open");
    // Keep the last good token, but try the file again on the next request.
    return cached_.empty() ? fixed_ : cached_;
  }
  lastError_.clear();
  cached_ = token;
  readAt_ = now;
  valid_ = true;
  return cached_;
}

void TokenSource::Invalidate() {
  std::lock_guard lock(mutex_);
  valid_ = false;
}

std::string TokenSource::LastError() const {
  std::lock_guard lock(mutex_);
  return lastError_;
}

}  // namespace cozy::kube
