// Splits a watch stream into its JSON values. The API server writes one event per line, but
// a client must not rely on that (research §4): values are found by bracket depth instead,
// so a value split across reads, or several in one read, come out whole.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cozy::kube {

class JsonStreamSplitter {
 public:
  // Appends bytes as they arrive.
  void Feed(std::string_view bytes);
  // The next complete top-level value (object or array), if one has arrived. Whitespace and
  // stray bytes between values are skipped.
  std::optional<std::string> Next();
  // Bytes held for a value not yet complete.
  size_t Pending() const { return buffer_.size() - start_; }

 private:
  std::string buffer_;
  size_t start_ = 0;    // first byte not yet handed out
  size_t scanned_ = 0;  // bytes of the current value already scanned
  int depth_ = 0;
  bool inString_ = false;
  bool escaped_ = false;
};

}  // namespace cozy::kube
