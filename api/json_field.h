// Reading JSON objects with errors that name the field: every accessor knows its path from the
// object's root ("spec.nodeSelector.matchExpressions[0].operator"), so a malformed object is
// reported as what is wrong and where, never as a bare type error.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cozy::api {

// A value of the wrong shape. `field` is the path from the object's root; `problem` says what
// is wrong with it, for people.
class DecodeError : public std::runtime_error {
 public:
  DecodeError(std::string field, std::string problem);
  const std::string& field() const { return field_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string field_;
  std::string problem_;
};

// A JSON value and its path. Cheap to copy: it refers to the value, which must outlive it.
class JsonField {
 public:
  JsonField(const nlohmann::json& value, std::string path)
      : value_(&value), path_(std::move(path)) {}

  const nlohmann::json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  [[noreturn]] void Fail(std::string_view problem) const;

  // Members. A missing or null member is absent, as the API server treats it.
  std::optional<JsonField> Find(std::string_view key) const;
  JsonField Require(std::string_view key) const;

  std::string AsString() const;
  int64_t AsInt() const;
  bool AsBool() const;
  std::vector<JsonField> AsArray() const;
  std::vector<std::pair<std::string, JsonField>> AsObjectMembers() const;
  std::map<std::string, std::string> AsStringMap() const;
  std::vector<std::string> AsStringList() const;
  // A Kubernetes quantity as it may appear in JSON: a string ("2", "500m") or a number.
  std::string AsQuantityText() const;

  // Shorthands for optional members.
  std::optional<std::string> OptionalString(std::string_view key) const;
  std::string StringOr(std::string_view key, std::string_view fallback) const;
  std::optional<int64_t> OptionalInt(std::string_view key) const;
  bool BoolOr(std::string_view key, bool fallback) const;
  std::map<std::string, std::string> StringMapOr(std::string_view key) const;

 private:
  void RequireObject() const;

  const nlohmann::json* value_;
  std::string path_;
};

// `path` extended by a member: `spec.count`, or `metadata.labels["tenant.cozystack.io/x"]`
// where the key is not a plain identifier.
std::string JoinPath(std::string_view path, std::string_view key);

// "string", "number", "object", ... for messages.
std::string_view JsonTypeName(const nlohmann::json& value);

}  // namespace cozy::api
