// Splits a watch stream into its JSON values. The API server writes one event per line, but
// a client must not rely on that (research §4): values are found by bracket depth instead,
// so a value split across reads, or several in one read, come out whole.
//
// What a server sends is bounded here: one value may be at most `maxValueBytes` long (16 MiB,
// client-go's cap on a watch frame) and nest at most kMaxJsonDepth deep. A value that passes
// either limit before it closes fails the splitter for good: the stream after it cannot be
// cut any more, and nothing more is buffered.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cozy::kube {

// client-go's cap on one watch frame (apimachinery runtime/serializer/streaming: maxBytes);
// this client also uses it for whole response bodies (ClientOptions).
inline constexpr size_t kDefaultMaxJsonBytes = size_t{16} << 20;
// Deeper than any Kubernetes object; nlohmann::json copies and compares recursively, so a
// value nested millions deep would overflow the stack long before it fills 16 MiB.
inline constexpr int kMaxJsonDepth = 1000;

class JsonStreamSplitter {
 public:
  explicit JsonStreamSplitter(size_t maxValueBytes = kDefaultMaxJsonBytes);
  // Appends bytes as they arrive (dropped once Failed()).
  void Feed(std::string_view bytes);
  // The next complete top-level value (object or array), if one has arrived. Whitespace and
  // stray bytes between values are skipped.
  std::optional<std::string> Next();
  // Bytes held for a value not yet complete.
  size_t Pending() const { return buffer_.size() - start_; }
  // A value passed the size or depth limit; Error() says which and where in the stream.
  bool Failed() const { return !error_.empty(); }
  const std::string& Error() const { return error_; }

 private:
  void Fail(std::string why);

  size_t maxValueBytes_;
  std::string buffer_;
  size_t start_ = 0;    // first byte not yet handed out
  size_t scanned_ = 0;  // bytes of the current value already scanned
  size_t dropped_ = 0;  // bytes of the stream erased from the front of buffer_
  int depth_ = 0;
  bool inString_ = false;
  bool escaped_ = false;
  std::string error_;
};

// Parses a JSON text from the network: never throws; null plus `error` set when the text is
// not JSON or nests deeper than kMaxJsonDepth.
nlohmann::json ParseNetworkJson(std::string_view text, std::string& error);

// Skimming a watch event (docs/controller.md, "Who wakes for a change"): for a kind of which the
// consumer keeps few objects (the pods that ask for an extended resource), most events need not
// become a JSON document. `wants` is offered every key inside the event's object with the path to
// it, from the object down ({"spec", "containers", "[]", "resources", "requests"} for a container's
// request; "[]" for an array's element), and says whether the key makes the object one to decode
// whole.
using SkimWants = std::function<bool(const std::vector<std::string>& path, const std::string& key)>;
struct SkimmedEvent {
  std::string type;     // ADDED, MODIFIED or DELETED
  nlohmann::json stub;  // {"metadata": {"name", "namespace" (if any), "resourceVersion"}}
};
// One pass over the event's text that builds no document. Returns the stub of an ADDED,
// MODIFIED or DELETED event whose object has a string name and resourceVersion and no key
// `wants`; nullopt for every other text (wanted, a BOOKMARK or ERROR, malformed, nested deeper
// than kMaxJsonDepth), which the caller parses whole, and whose errors that parse reports.
std::optional<SkimmedEvent> SkimEvent(std::string_view text, const SkimWants& wants);

// "a string", "a number", "an object", "null"...: for messages about wrong types.
std::string JsonTypeName(const nlohmann::json& value);

// A string field of an object, "" when absent or of another type: a body that is not what the
// server should send is still an error to report, never an exception.
std::string StringField(const nlohmann::json& object, const char* key);

}  // namespace cozy::kube
