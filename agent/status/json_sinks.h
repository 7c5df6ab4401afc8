// Two sinks the status writer (status_builder.cpp) writes the GPUNode into: a document the daemon
// publishes and compares, and text printed as it is written, the way `scan -o json` answers with
// no document in between (building, printing and freeing the document was half of an offline scan's
// instructions: docs/benchmarks.md, "Half of lspci's instructions").
//
// The printer prints what nlohmann::json's dump(2) prints for the same document, byte for byte,
// provided keys arrive in the order the document keeps them (byte order, std::map's): it refuses
// a key that does not sort after its object's previous one, so a writer that breaks the order
// fails loudly instead of printing differently (status_writer_test holds the two to each other).
#pragma once

#include <array>
#include <charconv>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cozy::agent {

// Builds a nlohmann::json document.
class JsonBuilder {
 public:
  void BeginObject() { Open(nlohmann::json::object()); }
  void BeginArray() { Open(nlohmann::json::array()); }
  void EndObject() { stack_.pop_back(); }
  void EndArray() { stack_.pop_back(); }
  void Key(std::string_view key) { key_ = key; }
  void String(std::string_view value) { Slot() = std::string(value); }
  template <typename Integer>
  void Number(Integer value) {
    Slot() = value;
  }
  void Bool(bool value) { Slot() = value; }
  // The whole document, once every object and array is closed.
  nlohmann::json Take() { return std::move(root_); }

 private:
  nlohmann::json& Slot();
  void Open(nlohmann::json value);

  nlohmann::json root_;
  std::vector<nlohmann::json*> stack_;  // the open objects and arrays, innermost last
  std::string key_;
};

// Prints JSON as dump(2) does, into `out`. With a `drain`, `out` is handed to it and emptied
// each time an object or array closes with at least `drainAt` bytes in it: the document is
// printed in pieces through one buffer instead of being held whole (what is drained stays
// printed if a later value throws).
class JsonPrinter {
 public:
  using Drain = std::function<void(std::string_view)>;
  explicit JsonPrinter(std::string& out, Drain drain = {}, size_t drainAt = 64 * 1024)
      : out_(out), drain_(std::move(drain)), drainAt_(drainAt) {}
  void BeginObject() { Open('{'); }
  void BeginArray() { Open('['); }
  void EndObject() { Close('}'); }
  void EndArray() { Close(']'); }
  // Throws std::logic_error for a key that does not sort after the previous one. The key must
  // outlive the object it is in and need no escaping (a plain literal, as the writer's are).
  void Key(std::string_view key);
  void String(std::string_view value);
  template <typename Integer>
  void Number(Integer value) {
    static_assert(std::is_integral_v<Integer>, "the status holds whole numbers only");
    BeforeValue();
    std::array<char, 24> digits;  // NOLINT(cppcoreguidelines-pro-type-member-init): written next
    const auto written = std::to_chars(digits.data(), digits.data() + digits.size(), value);
    out_.append(digits.data(), written.ptr);
  }
  void Bool(bool value) {
    BeforeValue();
    out_ += value ? "true" : "false";
  }

 private:
  struct Level {
    size_t members = 0;
    std::string_view lastKey;  // the writer's keys are literals: they outlive the object
  };
  void Open(char bracket);
  void Close(char bracket);
  void BeforeValue();  // the separator and indent an array element or the root needs
  void NewMember(Level& level);
  void Quoted(std::string_view text);  // as a JSON string, escaped as dump() escapes it

  std::string& out_;
  Drain drain_;
  size_t drainAt_;
  std::vector<Level> levels_;
  bool afterKey_ = false;
};

}  // namespace cozy::agent
