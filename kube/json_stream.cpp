#include "kube/json_stream.h"

namespace cozy::kube {

JsonStreamSplitter::JsonStreamSplitter(size_t maxValueBytes) : maxValueBytes_(maxValueBytes) {}

void JsonStreamSplitter::Fail(std::string why) {
  error_ = std::move(why);
  std::string().swap(buffer_);  // give the memory back, not just the size
  start_ = scanned_ = 0;
  depth_ = 0;
  inString_ = escaped_ = false;
}

void JsonStreamSplitter::Feed(std::string_view bytes) {
  if (Failed()) return;
  // Drop what was handed out before growing, so a long watch does not hold its history.
  if (start_ > 0 && start_ >= buffer_.size() / 2) {
    buffer_.erase(0, start_);
    scanned_ -= start_;
    dropped_ += start_;
    start_ = 0;
  }
  buffer_.append(bytes);
}

std::optional<std::string> JsonStreamSplitter::Next() {
  while (!Failed() && scanned_ < buffer_.size()) {
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
    if (scanned_ - start_ > maxValueBytes_) {
      Fail("the value starting at byte " + std::to_string(dropped_ + start_) +
           " of the stream is longer than " + std::to_string(maxValueBytes_) + " bytes");
      break;
    }
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
      if (++depth_ > kMaxJsonDepth) {
        Fail("the value starting at byte " + std::to_string(dropped_ + start_) +
             " of the stream nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        break;
      }
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

nlohmann::json ParseNetworkJson(std::string_view text, std::string& error) {
  error.clear();
  // nlohmann's parser is iterative, but copies, comparisons and dumps of what it builds
  // recurse, and its own stacks grow a word per level: a text nested too deep is refused
  // before parsing, by a scan that allocates nothing.
  int depth = 0;
  bool inString = false;
  bool escaped = false;
  for (char c : text) {
    if (inString) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        inString = false;
      }
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        error = "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
        return nullptr;
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    error = "is not JSON";
    return nullptr;
  }
  return value;
}

std::string JsonTypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float:
      return "a number";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::binary:
    case nlohmann::json::value_t::discarded:
      break;
  }
  return "not a JSON value";
}

}  // namespace cozy::kube
