#include "agent/status/json_sinks.h"

#include <array>
#include <cstring>
#include <stdexcept>

namespace cozy::agent {

nlohmann::json& JsonBuilder::Slot() {
  if (stack_.empty()) {
    return root_;
  }
  nlohmann::json& parent = *stack_.back();
  if (parent.is_object()) {
    return parent[key_];
  }
  parent.push_back(nullptr);
  return parent.back();
}

void JsonBuilder::Open(nlohmann::json value) {
  nlohmann::json& slot = Slot();
  slot = std::move(value);
  stack_.push_back(&slot);
}

void JsonPrinter::NewMember(Level& level) {
  out_ += level.members == 0 ? "\n" : ",\n";
  ++level.members;
  out_.append(2 * levels_.size(), ' ');
}

void JsonPrinter::BeforeValue() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!levels_.empty()) {
    NewMember(levels_.back());  // an array's element
  }
}

void JsonPrinter::Open(char bracket) {
  BeforeValue();
  out_ += bracket;
  levels_.push_back(Level{});
}

void JsonPrinter::Close(char bracket) {
  const size_t members = levels_.back().members;
  levels_.pop_back();
  if (members > 0) {
    out_ += '\n';
    out_.append(2 * levels_.size(), ' ');
  }
  out_ += bracket;
  if (drain_ && out_.size() >= drainAt_) {
    drain_(out_);
    out_.clear();  // keeps its capacity: the next piece reuses the same pages
  }
}

void JsonPrinter::Key(std::string_view key) {
  Level& level = levels_.back();
  if (level.members > 0 && !(key > level.lastKey)) {
    throw std::logic_error("JsonPrinter: key \"" + std::string(key) + "\" after \"" +
                           std::string(level.lastKey) + "\": keys must come in byte order");
  }
  level.lastKey = key;
  // `,\n`, the indent, `"key": ` in one go: the writer's keys are plain ASCII literals, with
  // nothing to escape, and this is where a scan's output spends its time.
  const bool first = level.members++ == 0;
  const size_t indent = 2 * levels_.size();
  const size_t at = out_.size();
  out_.resize(at + (first ? 1 : 2) + indent + key.size() + 4);
  char* write = out_.data() + at;
  if (!first) *write++ = ',';
  *write++ = '\n';
  std::memset(write, ' ', indent);
  write += indent;
  *write++ = '"';
  std::memcpy(write, key.data(), key.size());
  write += key.size();
  std::memcpy(write, "\": ", 3);
  afterKey_ = true;
}

void JsonPrinter::String(std::string_view value) {
  BeforeValue();
  Quoted(value);
}

namespace {

// What dump() writes in place of a character, or nothing when it writes the character itself.
std::string_view Escape(char c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      return {};
  }
}

// The characters dump() writes as they are: printable ASCII but the quote and the backslash.
constexpr std::array<bool, 256> kPlain = [] {
  std::array<bool, 256> plain{};
  for (size_t c = 0x20; c < 0x80; ++c) {
    plain[c] = c != '"' && c != '\\';
  }
  return plain;
}();

bool Plain(char c) { return kPlain[static_cast<unsigned char>(c)]; }

}  // namespace

void JsonPrinter::Quoted(std::string_view value) {
  const size_t start = out_.size();
  out_ += '"';
  size_t run = 0;  // the start of the characters not yet written
  for (size_t at = 0; at < value.size(); ++at) {
    const char c = value[at];
    if (Plain(c)) {
      continue;
    }
    if (static_cast<unsigned char>(c) >= 0x80) {
      // Beyond ASCII, nlohmann's own escaper: it checks the UTF-8 and throws as dump() does.
      out_.resize(start);
      out_ += nlohmann::json(std::string(value)).dump();
      return;
    }
    out_.append(value.data() + run, at - run);
    run = at + 1;
    const std::string_view escaped = Escape(c);
    if (!escaped.empty()) {
      out_ += escaped;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out_ += "\\u00";
      out_ += kHex[(c >> 4) & 0xf];
      out_ += kHex[c & 0xf];
    }
  }
  out_.append(value.data() + run, value.size() - run);
  out_ += '"';
}

}  // namespace cozy::agent
