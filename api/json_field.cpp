#include "api/json_field.h"

#include <limits>

namespace cozy::api {

DecodeError::DecodeError(std::string field, std::string problem)
    : std::runtime_error(field.empty() ? problem : field + ": " + problem),
      field_(std::move(field)),
      problem_(std::move(problem)) {}

std::string JoinPath(std::string_view path, std::string_view key) {
  bool plain = !key.empty();
  for (char c : key) {
    const bool identifier =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    plain = plain && identifier;
  }
  std::string joined(path);
  if (plain) {
    if (!joined.empty()) {
      joined += '.';
    }
    joined += key;
  } else {
    joined += "[\"";
    joined += key;
    joined += "\"]";
  }
  return joined;
}

std::string_view JsonTypeName(const nlohmann::json& value) {
  if (value.is_number_integer()) {
    return "integer";
  }
  if (value.is_number()) {
    return "number";
  }
  return value.type_name();
}

void JsonField::Fail(std::string_view problem) const {
  throw DecodeError(path_, std::string(problem));
}

void JsonField::RequireObject() const {
  if (!value_->is_object()) {
    Fail("expected an object, got " + std::string(JsonTypeName(*value_)));
  }
}

std::optional<JsonField> JsonField::Find(std::string_view key) const {
  RequireObject();
  const auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) {
    return std::nullopt;
  }
  return JsonField(*it, JoinPath(path_, key));
}

JsonField JsonField::Require(std::string_view key) const {
  std::optional<JsonField> member = Find(key);
  if (!member) {
    throw DecodeError(JoinPath(path_, key), "required, but missing");
  }
  return *member;
}

std::string JsonField::AsString() const {
  if (!value_->is_string()) {
    Fail("expected a string, got " + std::string(JsonTypeName(*value_)));
  }
  return value_->get<std::string>();
}

int64_t JsonField::AsInt() const {
  if (value_->is_number_unsigned()) {
    const auto value = value_->get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail("integer out of range");
    }
    return static_cast<int64_t>(value);
  }
  if (!value_->is_number_integer()) {
    Fail("expected an integer, got " + std::string(JsonTypeName(*value_)));
  }
  return value_->get<int64_t>();
}

bool JsonField::AsBool() const {
  if (!value_->is_boolean()) {
    Fail("expected a boolean, got " + std::string(JsonTypeName(*value_)));
  }
  return value_->get<bool>();
}

std::vector<JsonField> JsonField::AsArray() const {
  if (!value_->is_array()) {
    Fail("expected an array, got " + std::string(JsonTypeName(*value_)));
  }
  std::vector<JsonField> items;
  items.reserve(value_->size());
  size_t index = 0;
  for (const nlohmann::json& item : *value_) {
    items.emplace_back(item, path_ + "[" + std::to_string(index) + "]");
    ++index;
  }
  return items;
}

std::vector<std::pair<std::string, JsonField>> JsonField::AsObjectMembers() const {
  RequireObject();
  std::vector<std::pair<std::string, JsonField>> members;
  members.reserve(value_->size());
  for (const auto& [key, value] : value_->items()) {
    members.emplace_back(key, JsonField(value, JoinPath(path_, key)));
  }
  return members;
}

std::map<std::string, std::string> JsonField::AsStringMap() const {
  std::map<std::string, std::string> map;
  for (const auto& [key, value] : AsObjectMembers()) {
    map.emplace(key, value.AsString());
  }
  return map;
}

std::vector<std::string> JsonField::AsStringList() const {
  std::vector<std::string> list;
  for (const JsonField& item : AsArray()) {
    list.push_back(item.AsString());
  }
  return list;
}

std::string JsonField::AsQuantityText() const {
  if (value_->is_string()) {
    return value_->get<std::string>();
  }
  if (value_->is_number_integer()) {
    return value_->dump();
  }
  Fail("expected a quantity (a string such as \"2\"), got " + std::string(JsonTypeName(*value_)));
}

std::optional<std::string> JsonField::OptionalString(std::string_view key) const {
  std::optional<JsonField> member = Find(key);
  if (!member) {
    return std::nullopt;
  }
  return member->AsString();
}

std::string JsonField::StringOr(std::string_view key, std::string_view fallback) const {
  std::optional<std::string> value = OptionalString(key);
  return value ? *value : std::string(fallback);
}

std::optional<int64_t> JsonField::OptionalInt(std::string_view key) const {
  std::optional<JsonField> member = Find(key);
  if (!member) {
    return std::nullopt;
  }
  return member->AsInt();
}

bool JsonField::BoolOr(std::string_view key, bool fallback) const {
  std::optional<JsonField> member = Find(key);
  return member ? member->AsBool() : fallback;
}

std::map<std::string, std::string> JsonField::StringMapOr(std::string_view key) const {
  std::optional<JsonField> member = Find(key);
  return member ? member->AsStringMap() : std::map<std::string, std::string>{};
}

}  // namespace cozy::api
