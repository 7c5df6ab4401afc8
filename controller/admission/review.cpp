#include "controller/admission/review.h"

#include <openssl/evp.h>

#include "api/json_field.h"

namespace cozy::admission {
namespace {

using api::JsonField;

constexpr std::string_view kAdmissionApiVersion = "admission.k8s.io/v1";
constexpr std::string_view kAdmissionReviewKind = "AdmissionReview";

GroupVersionKind ReadKind(const JsonField& field) {
  return {field.StringOr("group", ""), field.Require("version").AsString(),
          field.Require("kind").AsString()};
}

GroupVersionResource ReadResource(const JsonField& field) {
  return {field.StringOr("group", ""), field.Require("version").AsString(),
          field.Require("resource").AsString()};
}

Operation ReadOperation(const JsonField& field) {
  const std::string text = field.AsString();
  for (const Operation operation :
       {Operation::kCreate, Operation::kUpdate, Operation::kDelete, Operation::kConnect}) {
    if (text == ToString(operation)) {
      return operation;
    }
  }
  field.Fail("unknown operation \"" + text + "\" (CREATE, UPDATE, DELETE or CONNECT)");
}

nlohmann::json ObjectOrNull(const JsonField& parent, std::string_view key) {
  const std::optional<JsonField> member = parent.Find(key);
  if (!member) {
    return nullptr;
  }
  if (!member->json().is_object()) {
    member->Fail("expected an object, got " + std::string(api::JsonTypeName(member->json())));
  }
  return member->json();
}

}  // namespace

std::string_view ToString(Operation operation) {
  switch (operation) {
    case Operation::kUpdate:
      return "UPDATE";
    case Operation::kDelete:
      return "DELETE";
    case Operation::kConnect:
      return "CONNECT";
    case Operation::kCreate:
      break;
  }
  return "CREATE";
}

AdmissionRequest DecodeAdmissionReview(const nlohmann::json& review) {
  if (!review.is_object()) {
    throw api::DecodeError("", "an AdmissionReview must be a JSON object, not " +
                                   std::string(api::JsonTypeName(review)));
  }
  const JsonField root(review, "");
  const JsonField apiVersion = root.Require("apiVersion");
  if (apiVersion.AsString() != kAdmissionApiVersion) {
    apiVersion.Fail("expected " + std::string(kAdmissionApiVersion) + ", got \"" +
                    apiVersion.AsString() + "\"");
  }
  const JsonField kind = root.Require("kind");
  if (kind.AsString() != kAdmissionReviewKind) {
    kind.Fail("expected " + std::string(kAdmissionReviewKind) + ", got \"" + kind.AsString() +
              "\"");
  }
  const JsonField request = root.Require("request");
  AdmissionRequest out;
  out.uid = request.Require("uid").AsString();
  if (out.uid.empty()) {
    request.Require("uid").Fail("is empty");
  }
  out.kind = ReadKind(request.Require("kind"));
  out.resource = ReadResource(request.Require("resource"));
  out.subResource = request.StringOr("subResource", "");
  if (const auto requestKind = request.Find("requestKind")) {
    out.requestKind = ReadKind(*requestKind);
  }
  if (const auto requestResource = request.Find("requestResource")) {
    out.requestResource = ReadResource(*requestResource);
  }
  out.requestSubResource = request.StringOr("requestSubResource", "");
  out.name = request.StringOr("name", "");
  out.namespaceName = request.StringOr("namespace", "");
  out.operation = ReadOperation(request.Require("operation"));
  if (const auto userInfo = request.Find("userInfo")) {
    out.userInfo.username = userInfo->StringOr("username", "");
    out.userInfo.uid = userInfo->StringOr("uid", "");
    if (const auto groups = userInfo->Find("groups")) {
      out.userInfo.groups = groups->AsStringList();
    }
    if (const auto extra = userInfo->Find("extra")) {
      for (const auto& [key, values] : extra->AsObjectMembers()) {
        out.userInfo.extra[key] = values.AsStringList();
      }
    }
  }
  out.object = ObjectOrNull(request, "object");
  out.oldObject = ObjectOrNull(request, "oldObject");
  out.dryRun = request.BoolOr("dryRun", false);
  out.options = ObjectOrNull(request, "options");
  return out;
}

AdmissionRequest DecodeAdmissionReview(std::string_view body) {
  const nlohmann::json review = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (review.is_discarded()) {
    throw api::DecodeError("", "the AdmissionReview is not JSON");
  }
  return DecodeAdmissionReview(review);
}

AdmissionResponse Allow(const AdmissionRequest& request, nlohmann::json patch) {
  AdmissionResponse response;
  response.uid = request.uid;
  response.allowed = true;
  response.patch = std::move(patch);
  return response;
}

AdmissionResponse Refuse(const AdmissionRequest& request, std::string message) {
  AdmissionResponse response;
  response.uid = request.uid;
  response.allowed = false;
  response.message = std::move(message);
  return response;
}

nlohmann::json EncodeAdmissionReview(const AdmissionResponse& response) {
  nlohmann::json answer = {{"uid", response.uid}, {"allowed", response.allowed}};
  if (!response.allowed) {
    answer["status"] = {{"code", 403}, {"reason", "Forbidden"}, {"message", response.message}};
  }
  if (response.patch.is_array() && !response.patch.empty()) {
    answer["patchType"] = "JSONPatch";
    answer["patch"] = Base64(response.patch.dump());
  }
  if (!response.warnings.empty()) {
    answer["warnings"] = response.warnings;
  }
  return {{"apiVersion", kAdmissionApiVersion},
          {"kind", kAdmissionReviewKind},
          {"response", std::move(answer)}};
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                      reinterpret_cast<const unsigned char*>(bytes.data()),
                                      static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(written));
  return out;
}

}  // namespace cozy::admission
