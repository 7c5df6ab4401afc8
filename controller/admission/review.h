// AdmissionReview v1 (admission.k8s.io/v1) as the API server sends it to a webhook and as the
// webhook answers: the request decoded into plain values, the response encoded with its patch.
// Pure: the HTTPS server hands in the body it read and writes back what Encode returns.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cozy::admission {

struct GroupVersionKind {
  std::string group;  // empty for the core group
  std::string version;
  std::string kind;
  bool operator==(const GroupVersionKind&) const = default;
};

struct GroupVersionResource {
  std::string group;
  std::string version;
  std::string resource;
  bool operator==(const GroupVersionResource&) const = default;
};

struct UserInfo {
  std::string username;
  std::string uid;
  std::vector<std::string> groups;
  // e.g. authentication.kubernetes.io/node-name of a pod-bound service account token.
  std::map<std::string, std::vector<std::string>> extra;
};

enum class Operation { kCreate, kUpdate, kDelete, kConnect };
std::string_view ToString(Operation operation);

struct AdmissionRequest {
  std::string uid;  // each call has its own, a reinvocation too
  GroupVersionKind kind;
  GroupVersionResource resource;
  std::string subResource;
  std::optional<GroupVersionKind> requestKind;
  std::optional<GroupVersionResource> requestResource;
  std::string requestSubResource;
  std::string name;  // empty on a CREATE whose name the server generates
  std::string namespaceName;
  Operation operation = Operation::kCreate;
  UserInfo userInfo;
  nlohmann::json object;     // null when absent (DELETE)
  nlohmann::json oldObject;  // null when absent (CREATE)
  bool dryRun = false;
  nlohmann::json options;  // CreateOptions, UpdateOptions, ...; null when absent
};

// A review of another apiVersion or kind, without a request, or whose request lacks uid, kind,
// resource or operation, or has a field of the wrong shape: api::DecodeError naming the field
// ("request.userInfo.groups[1]: expected a string, got number").
AdmissionRequest DecodeAdmissionReview(const nlohmann::json& review);
// The body as read from the wire; a body that is not JSON is a DecodeError too.
AdmissionRequest DecodeAdmissionReview(std::string_view body);

struct AdmissionResponse {
  std::string uid;  // the request's
  bool allowed = true;
  std::string message;   // a refusal's reason, for the tenant who asked
  nlohmann::json patch;  // a JSONPatch array; null or empty: no patch
  std::vector<std::string> warnings;
};

AdmissionResponse Allow(const AdmissionRequest& request, nlohmann::json patch = nullptr);
// 403 Forbidden with the message: what the API server shows the tenant.
AdmissionResponse Refuse(const AdmissionRequest& request, std::string message);

// The AdmissionReview v1 answer: `uid` and `allowed`; on a refusal `status` {code 403, reason
// Forbidden, message}; with patch ops `patchType: JSONPatch` and `patch` (base64 of the compact
// ops); `warnings` when there are any.
nlohmann::json EncodeAdmissionReview(const AdmissionResponse& response);

// Standard base64 with padding (OpenSSL's EVP_EncodeBlock), as the review's `patch` carries it.
std::string Base64(std::string_view bytes);

}  // namespace cozy::admission
