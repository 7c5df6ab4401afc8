#include "test/chart/chart_render.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>

namespace cozy::chart {
namespace {

const char* const kSubset = "outside the chart's template subset (docs/install.md)";

// One piece of a template: literal text or the inside of a {{ ... }} action.
struct Token {
  bool action = false;
  std::string text;
  int line = 1;
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string Trim(const std::string& text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && IsSpace(text[begin])) ++begin;
  while (end > begin && IsSpace(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

class Renderer {
 public:
  Renderer(const Context& context, std::string file) : context_(context), file_(std::move(file)) {}

  std::string Render(const std::string& text) {
    tokens_ = Tokenize(text);
    position_ = 0;
    std::string out;
    const std::string stop = RenderBlock(out, true);
    if (!stop.empty()) Fail(tokens_[position_ - 1].line, "'" + stop + "' without 'if'");
    return out;
  }

 private:
  [[noreturn]] void Fail(int line, const std::string& message) const {
    throw RenderError(file_ + ":" + std::to_string(line) + ": " + message);
  }

  std::vector<Token> Tokenize(const std::string& text) const {
    std::vector<Token> tokens;
    size_t at = 0;
    int line = 1;
    bool trimNext = false;
    while (at < text.size()) {
      const size_t open = text.find("{{", at);
      std::string literal =
          text.substr(at, open == std::string::npos ? std::string::npos : open - at);
      if (trimNext) {
        literal.erase(literal.begin(), std::find_if_not(literal.begin(), literal.end(), IsSpace));
      }
      const int literalLine = line;
      line += static_cast<int>(std::count(
          text.begin() + static_cast<long>(at),
          open == std::string::npos ? text.end() : text.begin() + static_cast<long>(open), '\n'));
      if (open == std::string::npos) {
        tokens.push_back({false, literal, literalLine});
        break;
      }
      const size_t close = text.find("}}", open + 2);
      if (close == std::string::npos) Fail(line, "'{{' without '}}'");
      std::string inside = text.substr(open + 2, close - open - 2);
      if (inside.starts_with("- ") || inside.starts_with("-\n")) {
        literal.erase(std::find_if_not(literal.rbegin(), literal.rend(), IsSpace).base(),
                      literal.end());
        inside.erase(0, 1);
      } else if (inside.starts_with("-")) {
        Fail(line, "'{{-' needs a space after the dash");
      }
      trimNext = inside.ends_with(" -") || inside.ends_with("\n-");
      if (trimNext) inside.pop_back();
      tokens.push_back({false, literal, literalLine});
      tokens.push_back({true, Trim(inside), line});
      line += static_cast<int>(std::count(inside.begin(), inside.end(), '\n'));
      at = close + 2;
    }
    return tokens;
  }

  // Renders tokens into `out` (when `emit`) up to an `else` or `end`, which it returns ("" at
  // the end of the text).
  std::string RenderBlock(std::string& out, bool emit) {
    while (position_ < tokens_.size()) {
      const Token& token = tokens_[position_++];
      if (!token.action) {
        if (emit) out += token.text;
        continue;
      }
      const std::string& body = token.text;
      if (body.starts_with("/*")) {
        if (!body.ends_with("*/")) Fail(token.line, "unterminated comment");
        continue;
      }
      const std::string word = body.substr(0, body.find_first_of(" \t\n"));
      if (word == "else" || word == "end") {
        if (body != word) Fail(token.line, "'" + body + "' is " + kSubset);
        return word;
      }
      if (word == "if") {
        const bool condition = Condition(Trim(body.substr(2)), token.line);
        std::string stop = RenderBlock(out, emit && condition);
        if (stop == "else") stop = RenderBlock(out, emit && !condition);
        if (stop != "end") Fail(token.line, "'if' without 'end'");
        continue;
      }
      if (word == "range") {
        Range(Trim(body.substr(5)), token.line, out, emit);
        continue;
      }
      // A skipped branch is still checked against the subset, not for its values.
      out += Output(body, token.line, emit);
    }
    return "";
  }

  // `if X` or `if or X Y ...` (Go's `or`: true when any argument is).
  bool Condition(const std::string& expression, int line) const {
    if (!expression.starts_with("or ")) return Truthy(Evaluate(expression, line));
    std::stringstream arguments(expression.substr(3));
    bool any = false;
    int count = 0;
    for (std::string argument; arguments >> argument; ++count) {
      any = Truthy(Evaluate(argument, line)) || any;  // every argument is checked
    }
    if (count < 2) Fail(line, "'or' takes two or more arguments");
    return any;
  }

  // `range $item := LIST` or `range $index, $item := LIST` ... `end`: the block once per item
  // with the variables bound (Go's range over a slice; no `else`, no range over `.`).
  void Range(const std::string& clause, int line, std::string& out, bool emit) {
    static const std::regex form(
        R"(^(?:\$([A-Za-z_][A-Za-z0-9_]*)\s*,\s*)?\$([A-Za-z_][A-Za-z0-9_]*)\s*:=\s*(\S+)$)");
    std::smatch match;
    if (!std::regex_match(clause, match, form)) {
      Fail(line, "'range " + clause + "' is " + kSubset + ": use 'range $i, $x := LIST'");
    }
    const std::string index = match[1].str();
    const std::string item = match[2].str();
    const YAML::Node list = Evaluate(match[3].str(), line);
    if (emit && list.IsDefined() && !list.IsNull() && !list.IsSequence()) {
      Fail(line, match[3].str() + " is not a list: range takes lists only");
    }
    const size_t start = position_;
    // YAML::Node's operator= writes through to the node it refers to: bind by erase and
    // emplace, restore by move, never assign one node over another.
    auto saved = variables_;
    const auto body = [&](bool emitItem, const YAML::Node& at, const YAML::Node& value) {
      position_ = start;
      if (!index.empty()) {
        variables_.erase(index);
        variables_.emplace(index, at);
      }
      variables_.erase(item);
      variables_.emplace(item, value);
      const std::string stop = RenderBlock(out, emitItem);
      if (stop == "else") Fail(line, "'range' with 'else' is " + std::string(kSubset));
      if (stop != "end") Fail(line, "'range' without 'end'");
    };
    const size_t items = emit && list.IsSequence() ? list.size() : 0;
    if (items == 0) body(false, YAML::Node(), YAML::Node());  // checked, not emitted
    for (size_t i = 0; i < items; ++i) body(true, YAML::Node(i), list[i]);
    variables_ = std::move(saved);
  }

  // A path of keys below `node`; an undefined node when one is missing.
  static YAML::Node Lookup(const YAML::Node& root, const std::string& path) {
    // Node::reset, not operator=, which would overwrite the value in the tree.
    YAML::Node node;
    node.reset(root);
    std::stringstream keys(path);
    for (std::string key; std::getline(keys, key, '.');) {
      if (key.empty()) continue;
      if (!node.IsMap() || !node[key].IsDefined()) return YAML::Node();
      const YAML::Node next = node[key];
      node.reset(next);
    }
    return node;
  }

  // `.Values.a.b`, `$var.a.b`, `.Release.Name|Namespace`, `.Chart.Name|Version|AppVersion`.
  YAML::Node Evaluate(const std::string& expression, int line) const {
    static const std::regex values(R"(^\.Values((\.[A-Za-z_][A-Za-z0-9_]*)+)$)");
    static const std::regex variable(
        R"(^\$([A-Za-z_][A-Za-z0-9_]*)((\.[A-Za-z_][A-Za-z0-9_]*)*)$)");
    std::smatch match;
    if (std::regex_match(expression, match, values)) {
      return Lookup(context_.values, match[1].str());
    }
    if (std::regex_match(expression, match, variable)) {
      const auto found = variables_.find(match[1].str());
      if (found == variables_.end()) Fail(line, "undefined variable $" + match[1].str());
      return Lookup(found->second, match[2].str());
    }
    if (expression == ".Release.Name") return YAML::Node(context_.release.name);
    if (expression == ".Release.Namespace") return YAML::Node(context_.release.ns);
    static const std::regex chart(R"(^\.Chart\.(Name|Version|AppVersion)$)");
    if (std::regex_match(expression, match, chart)) {
      std::string key = match[1].str();
      key[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(key[0])));
      const YAML::Node node = context_.chart[key];
      if (!node.IsDefined() || !node.IsScalar()) Fail(line, "Chart.yaml has no " + key);
      return node;
    }
    Fail(line, "'" + expression + "' is " + kSubset);
  }

  // Helm's truth: false, 0, null, "", an empty map or list are false.
  static bool Truthy(const YAML::Node& node) {
    if (!node.IsDefined() || node.IsNull()) return false;
    if (node.IsMap() || node.IsSequence()) return node.size() > 0;
    const std::string& text = node.Scalar();
    if (text.empty()) return false;
    if (node.Tag() == "!") return true;  // a quoted string
    static const std::regex falsy(R"(^(false|False|FALSE|0|0\.0*|~|null|Null|NULL)$)");
    return !std::regex_match(text, falsy);
  }

  std::string Output(const std::string& body, int line, bool emit) const {
    std::vector<std::string> stages;
    std::stringstream pipeline(body);
    for (std::string stage; std::getline(pipeline, stage, '|');) stages.push_back(Trim(stage));
    static const std::regex toYaml(R"(^toYaml\s+(\S+)$)");
    static const std::regex nindent(R"(^nindent\s+([0-9]+)$)");
    static const std::regex toJson(R"(^toJson\s+(\S+)$)");
    static const std::regex join(R"re(^join\s+"([^"\\]*)"\s+(\S+)$)re");
    std::smatch match;
    if (std::regex_match(stages[0], match, toJson) || std::regex_match(stages[0], match, join)) {
      const bool isJoin = stages[0].starts_with("join");
      const std::string target = match[isJoin ? 2 : 1].str();
      if (stages.size() != 1) Fail(line, "'" + body + "': no pipeline after toJson or join");
      const YAML::Node node = Evaluate(target, line);
      if (!emit) return "";
      if (!node.IsDefined() || node.IsNull()) Fail(line, target + " has no value");
      if (!isJoin) return ToJson(node);
      if (!node.IsSequence()) Fail(line, target + " is not a list: join takes lists only");
      std::string out;
      for (size_t i = 0; i < node.size(); ++i) {
        if (!node[i].IsScalar()) Fail(line, target + " holds a map or list: join takes scalars");
        out += (i == 0 ? "" : match[1].str()) + node[i].Scalar();
      }
      return out;
    }
    if (std::regex_match(stages[0], match, toYaml)) {
      std::smatch indent;
      if (stages.size() != 2 || !std::regex_match(stages[1], indent, nindent)) {
        Fail(line, "'" + body + "': toYaml must be followed by '| nindent N' (the subset)");
      }
      const YAML::Node node = Evaluate(match[1].str(), line);
      if (!emit) return "";
      if (!node.IsDefined() || node.IsNull()) Fail(line, match[1].str() + " has no value");
      const std::string pad(std::stoul(indent[1].str()), ' ');
      std::string out;
      std::stringstream lines(ToYaml(node));
      for (std::string text; std::getline(lines, text);) out += "\n" + pad + text;
      return out;
    }
    const bool quote = stages.size() == 2 && stages[1] == "quote";
    if (stages.size() > 2 || (stages.size() == 2 && !quote) ||
        stages[0].find_first_of(" \t\n") != std::string::npos) {
      Fail(line, "'" + body + "' is " + kSubset);
    }
    const YAML::Node node = Evaluate(stages[0], line);
    if (!emit) return "";
    if (!node.IsDefined() || node.IsNull()) Fail(line, stages[0] + " has no value");
    if (!node.IsScalar()) Fail(line, stages[0] + " is a map or list: use toYaml | nindent");
    if (!quote) return node.Scalar();
    std::string out = "\"";
    for (const char c : node.Scalar()) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }

  const Context& context_;
  std::string file_;
  std::map<std::string, YAML::Node> variables_;
  std::vector<Token> tokens_;
  size_t position_ = 0;
};

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void Emit(YAML::Emitter& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key;
        Emit(out, entry.first);
        out << YAML::Value;
        Emit(out, entry.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node) Emit(out, item);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      // yaml-cpp forgets quoting; a quoted "true" must not come back as a boolean.
      if (node.Tag() == "!") out << YAML::DoubleQuoted;
      out << node.Scalar();
      break;
    default:
      out << YAML::Null;
  }
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw RenderError("cannot read " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string RenderTemplate(const std::string& text, const Context& context,
                           const std::string& file) {
  return Renderer(context, file).Render(text);
}

YAML::Node MergeValues(const YAML::Node& base, const YAML::Node& overrides) {
  if (!overrides.IsDefined() || overrides.IsNull()) return YAML::Clone(base);
  if (!base.IsMap() || !overrides.IsMap()) return YAML::Clone(overrides);
  YAML::Node merged = YAML::Clone(base);
  for (const auto& entry : overrides) {
    const std::string key = entry.first.Scalar();
    if (entry.second.IsNull()) {
      merged.remove(key);
    } else {
      merged[key] = MergeValues(merged[key], entry.second);
    }
  }
  return merged;
}

std::string ToYaml(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  out.SetMapFormat(YAML::Block);
  Emit(out, node);
  std::string text = out.c_str();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::string ToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      std::map<std::string, YAML::Node> sorted;  // Go's encoding/json sorts map keys
      for (const auto& entry : node) sorted.emplace(entry.first.Scalar(), entry.second);
      std::string out = "{";
      for (const auto& [key, value] : sorted) {
        out += (out.size() > 1 ? "," : "") + JsonString(key) + ":" + ToJson(value);
      }
      return out + "}";
    }
    case YAML::NodeType::Sequence: {
      std::string out = "[";
      for (size_t i = 0; i < node.size(); ++i) out += (i ? "," : "") + ToJson(node[i]);
      return out + "]";
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return JsonString(text);  // quoted: always a string
      static const std::regex number(R"(^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$)");
      static const std::regex truth(R"(^(true|True|TRUE|false|False|FALSE)$)");
      static const std::regex null(R"(^(~|null|Null|NULL)$)");
      if (std::regex_match(text, number)) return text;
      if (std::regex_match(text, truth)) {
        return text[0] == 't' || text[0] == 'T' ? "true" : "false";
      }
      if (std::regex_match(text, null)) return "null";
      return JsonString(text);
    }
    default:
      return "null";
  }
}

std::vector<RenderedDocument> RenderChart(const std::filesystem::path& chartDir,
                                          const YAML::Node& overrides, const Release& release) {
  Context context;
  context.chart = YAML::LoadFile((chartDir / "Chart.yaml").string());
  context.values = MergeValues(YAML::LoadFile((chartDir / "values.yaml").string()), overrides);
  context.release = release;
  std::vector<std::filesystem::path> files;
  // Helm renders the templates of subdirectories too (templates/crds/).
  for (const auto& entry : std::filesystem::recursive_directory_iterator(chartDir / "templates")) {
    if (entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !(name.ends_with(".yaml") || name.ends_with(".yml")) ||
        name.starts_with("_")) {
      throw RenderError(
          "templates/" +
          std::filesystem::relative(entry.path(), chartDir / "templates").generic_string() +
          ": only plain .yaml templates are " + kSubset);
    }
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<RenderedDocument> documents;
  static const std::regex separator(R"((^|\n)---[ \t]*(\n|$))");
  for (const auto& path : files) {
    const std::string source =
        "templates/" + std::filesystem::relative(path, chartDir / "templates").generic_string();
    const std::string rendered = RenderTemplate(ReadFile(path), context, source);
    std::sregex_token_iterator part(rendered.begin(), rendered.end(), separator, -1);
    for (; part != std::sregex_token_iterator(); ++part) {
      const std::string text = part->str();
      const YAML::Node probe = YAML::Load(text);  // comments only: Null
      if (probe.IsDefined() && !probe.IsNull()) documents.push_back({source, text});
    }
  }
  return documents;
}

}  // namespace cozy::chart
