#include "kube/json_stream.h"

namespace cozy::kube {

void JsonStreamSplitter::Feed(std::string_view bytes) {
  // Drop what was handed out before growing, so a long watch does not hold its history.
  if (start_ > 0 && start_ >= buffer_.size() / 2) {
    buffer_.erase(0, start_);
    scanned_ -= start_;
    start_ = 0;
  }
  buffer_.append(bytes);
}

std::optional<std::string> JsonStreamSplitter::Next() {
  while (scanned_ < buffer_.size()) {
    char c = buffer_[scanned_];
    if (depth_ == 0) {
      // Between values: skip anything until a value opens.
      if (c != '{' && c != '[') {
        ++scanned_;
        start_ = scanned_;
        continue;
      }
      start_ = scanned_;
    }
    ++scanned_;
    if (inString_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        inString_ = false;
      }
      continue;
    }
    if (c == '"') {
      inString_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        std::string value = buffer_.substr(start_, scanned_ - start_);
        start_ = scanned_;
        return value;
      }
    }
  }
  return std::nullopt;
}

}  // namespace cozy::kube
