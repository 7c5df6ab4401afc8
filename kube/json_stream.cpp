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

std::string StringField(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
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

namespace {

// nlohmann's SAX interface: the event's type and its object's metadata are kept, every key
// inside the object is offered to `wants`; returning false ends the parse (a wanted key, a
// text nested too deep).
class Skimmer {
 public:
  using json = nlohmann::json;
  explicit Skimmer(const SkimWants& wants) : wants_(wants) {}

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool string(json::string_t& value) {
    if (inArray_.empty() || inArray_.back()) return true;  // an element: no key names it
    if (path_.empty() && key_ == "type") {
      type_ = value;
    } else if (path_.size() == 2 && path_[0] == "object" && path_[1] == "metadata") {
      if (key_ == "name") name_ = value;
      if (key_ == "namespace") namespace_ = value;
      if (key_ == "resourceVersion") resourceVersion_ = value;
    }
    return true;
  }
  bool start_object(std::size_t) { return Open(false); }
  bool start_array(std::size_t) { return Open(true); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(json::string_t& key) {
    key_.swap(key);  // the parser's buffer, which it clears before the next token
    // A key read again (a hostile text) drops what its first value gave: the whole parse keeps
    // the last value, and so does the skim.
    if (path_.empty()) {
      if (key_ == "type") type_.clear();
      if (key_ == "object") {
        objectIsObject_ = false;
        name_.reset(), namespace_.reset(), resourceVersion_.reset();
      }
    } else if (path_.size() == 1 && path_[0] == "object" && key_ == "metadata") {
      name_.reset(), namespace_.reset(), resourceVersion_.reset();
    } else if (path_.size() == 2 && path_[0] == "object" && path_[1] == "metadata") {
      if (key_ == "name") name_.reset();
      if (key_ == "namespace") namespace_.reset();
      if (key_ == "resourceVersion") resourceVersion_.reset();
    }
    return !(inObject_ && wants_(inner_, key_));
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }

  std::optional<SkimmedEvent> Result() const {
    if (type_ != "ADDED" && type_ != "MODIFIED" && type_ != "DELETED") return std::nullopt;
    if (!objectIsObject_) return std::nullopt;
    if (!name_ || !resourceVersion_) return std::nullopt;
    json metadata = {{"name", *name_}, {"resourceVersion", *resourceVersion_}};
    if (namespace_) metadata["namespace"] = *namespace_;
    return SkimmedEvent{type_, {{"metadata", std::move(metadata)}}};
  }

 private:
  // A container opens under the key just read, or as an element of the array it is in; the
  // root has no name. inArray_ holds one entry per open container: its size is the depth.
  bool Open(bool array) {
    if (inArray_.size() == 1 && !inArray_.back() && key_ == "object") objectIsObject_ = !array;
    if (!inArray_.empty()) {
      path_.push_back(inArray_.back() ? "[]" : key_);
      if (path_.size() == 1) {
        inObject_ = path_[0] == "object";
      } else if (inObject_) {
        inner_.push_back(path_.back());
      }
    }
    inArray_.push_back(array);
    return inArray_.size() <= static_cast<size_t>(kMaxJsonDepth);
  }
  bool Close() {
    inArray_.pop_back();
    if (!inArray_.empty()) {
      if (path_.size() == 1) {
        inObject_ = false;
      } else if (inObject_) {
        inner_.pop_back();
      }
      path_.pop_back();
    }
    return true;
  }

  const SkimWants& wants_;
  std::vector<std::string> path_;   // the names of the open containers under the root
  std::vector<std::string> inner_;  // path_ below "object", offered to wants_
  bool inObject_ = false;           // inside the event's "object"
  bool objectIsObject_ = false;     // the event's last "object" is an object
  std::vector<bool> inArray_;
  std::string key_;
  std::string type_;
  std::optional<std::string> name_, namespace_, resourceVersion_;
};

}  // namespace

std::optional<SkimmedEvent> SkimEvent(std::string_view text, const SkimWants& wants) {
  Skimmer skimmer(wants);
  if (!nlohmann::json::sax_parse(text, &skimmer)) return std::nullopt;
  return skimmer.Result();
}

}  // namespace cozy::kube
