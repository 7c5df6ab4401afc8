// Admission webhooks as kube-apiserver calls them (kubernetes/apiserver
// pkg/admission/plugin/webhook: generic/webhook.go matching, mutating/dispatcher.go and
// validating/dispatcher.go, request/admissionreview.go, errors/statuserror.go;
// pkg/util/webhook/client.go): MutatingWebhookConfigurations and
// ValidatingWebhookConfigurations are read from the store, each matching webhook gets an
// AdmissionReview v1 over HTTPS (libcurl, verified against its caBundle and the service's DNS
// name), mutating ones first in configuration-name order with one reinvocation round, then the
// built-in validation, then validating ones. No server mutex is held while a webhook is called.
#include <curl/curl.h>

#include <algorithm>
#include <mutex>

#include "test/fakes/fake_apiserver_internal.h"

namespace cozy::fake {
using namespace internal;  // NOLINT

json UserInfo::ToJson() const {
  json out = {{"username", username}};
  if (!uid.empty()) out["uid"] = uid;
  if (!groups.empty()) out["groups"] = groups;
  if (!extra.empty()) out["extra"] = extra;
  return out;
}

UserInfo UserInfo::FromJson(const json& value) {
  if (!value.is_object()) throw std::invalid_argument("a user is a JSON object");
  UserInfo user;
  for (const auto& [key, field] : value.items()) {
    try {
      if (key == "username") {
        user.username = field.get<std::string>();
      } else if (key == "uid") {
        user.uid = field.get<std::string>();
      } else if (key == "groups") {
        user.groups = field.get<std::vector<std::string>>();
      } else if (key == "extra") {
        user.extra = field.get<std::map<std::string, std::vector<std::string>>>();
      } else {
        throw std::invalid_argument("unknown user field \"" + key + "\"");
      }
    } catch (const json::exception&) {
      throw std::invalid_argument("user field \"" + key + "\" has the wrong type");
    }
  }
  if (user.username.empty()) throw std::invalid_argument("a user needs a username");
  return user;
}

UserInfo DefaultAdmin() {
  return UserInfo{"system:admin", "", {"system:masters", "system:authenticated"}, {}};
}

void FakeApiServer::SetUser(const std::string& token, UserInfo user) {
  // The authenticator's AuthenticatedGroupAdder: every authenticated user is in this group.
  if (std::find(user.groups.begin(), user.groups.end(), "system:authenticated") ==
      user.groups.end()) {
    user.groups.push_back("system:authenticated");
  }
  std::lock_guard lock(mutex_);
  users_[token] = std::move(user);
}

void FakeApiServer::SetServiceEndpoint(const std::string& ns, const std::string& name, int port,
                                       std::string host) {
  std::lock_guard lock(mutex_);
  serviceEndpoints_[ns + "/" + name] = {std::move(host), port};
  serviceEndpointSets_.erase(ns + "/" + name);
}

void FakeApiServer::SetServiceEndpoints(const std::string& ns, const std::string& name,
                                        const std::vector<int>& ports) {
  std::lock_guard lock(mutex_);
  serviceEndpoints_[ns + "/" + name] = {"127.0.0.1", ports.at(0)};
  serviceEndpointSets_[ns + "/" + name] = ports;
  endpointTurn_ = 0;  // the next call goes to the first
}

void FakeApiServer::EnableVirtApiMutator(bool enabled) {
  std::lock_guard lock(mutex_);
  virtApiMutator_ = enabled;
}

UserInfo FakeApiServer::UserFor(const httplib::Request& request) const {
  std::string authorization = request.get_header_value("Authorization");
  std::string token = authorization.rfind("Bearer ", 0) == 0 ? authorization.substr(7) : "";
  std::lock_guard lock(mutex_);
  auto it = users_.find(token);
  return it == users_.end() ? DefaultAdmin() : it->second;
}

bool FakeApiServer::AdmissionConfiguredLocked() const {
  if (virtApiMutator_) return true;
  for (const char* plural : {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}) {
    auto it = objects_.find(std::string("admissionregistration.k8s.io/") + plural);
    if (it != objects_.end() && !it->second.empty()) return true;
  }
  return false;
}

namespace {

constexpr const char* kVirtApiConfig = "virt-api-mutator";
constexpr const char* kVirtApiWebhook = "virtualmachineinstances-mutator.kubevirt.io";

// Standard alphabet; padding and whitespace ignored; throws on any other character.
std::string Base64Decode(const std::string& text) {
  std::string out;
  unsigned bits = 0;
  int count = 0;
  for (char c : text) {
    int value;
    if (c >= 'A' && c <= 'Z') {
      value = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      value = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      value = c - '0' + 52;
    } else if (c == '+') {
      value = 62;
    } else if (c == '/') {
      value = 63;
    } else if (c == '=' || c == '\n' || c == '\r' || c == ' ') {
      continue;
    } else {
      throw std::invalid_argument("illegal base64 data");
    }
    bits = (bits << 6) | static_cast<unsigned>(value);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xff));
    }
  }
  return out;
}

bool Contains(const json& list, const std::string& value) {
  if (!list.is_array()) return false;
  for (const auto& item : list) {
    if (item.is_string() && (item.get<std::string>() == value)) return true;
  }
  return false;
}

// A metav1.LabelSelector (matchLabels, matchExpressions) on a label map; absent or empty
// selects everything.
bool SelectorMatches(const json& selector, const json& labels) {
  if (!selector.is_object()) return true;
  auto label = [&labels](const std::string& key) -> const json* {
    if (!labels.is_object() || !labels.contains(key)) return nullptr;
    return &labels[key];
  };
  const json matchLabels = selector.value("matchLabels", json::object());
  for (const auto& [key, value] : matchLabels.items()) {
    const json* have = label(key);
    if (!have || *have != value) return false;
  }
  for (const auto& expression : selector.value("matchExpressions", json::array())) {
    const std::string key = expression.value("key", "");
    const std::string op = expression.value("operator", "");
    const json values = expression.value("values", json::array());
    const json* have = label(key);
    bool in = have && have->is_string() && Contains(values, have->get<std::string>());
    if (op == "In" && !in) return false;
    if (op == "NotIn" && in) return false;
    if (op == "Exists" && !have) return false;
    if (op == "DoesNotExist" && have) return false;
  }
  return true;
}

json LabelsOf(const json& object) {
  if (!object.is_object() || !object.contains("metadata")) return json::object();
  return object["metadata"].value("labels", json::object());
}

// A RuleWithOperations against the request (admissionregistration/v1 Rule; generic/rules.go).
bool RuleMatches(const json& rule, const std::string& operation, const std::string& group,
                 const std::string& version, const std::string& plural,
                 const std::string& subresource, bool namespaced) {
  const json operations = rule.value("operations", json::array());
  if (!Contains(operations, "*") && !Contains(operations, operation)) return false;
  const json groups = rule.value("apiGroups", json::array());
  if (!Contains(groups, "*") && !Contains(groups, group)) return false;
  const json versions = rule.value("apiVersions", json::array());
  if (!Contains(versions, "*") && !Contains(versions, version)) return false;
  const std::string scope = rule.value("scope", "*");
  if (scope == "Cluster" && namespaced) return false;
  if (scope == "Namespaced" && !namespaced) return false;
  for (const auto& item : rule.value("resources", json::array())) {
    if (!item.is_string()) continue;
    const std::string resource = item.get<std::string>();
    if (resource == "*/*") return true;
    const auto slash = resource.find('/');
    if (subresource.empty()) {
      if (slash == std::string::npos && (resource == "*" || resource == plural)) return true;
    } else if (slash != std::string::npos) {
      const std::string main = resource.substr(0, slash);
      const std::string sub = resource.substr(slash + 1);
      if ((main == "*" || main == plural) && (sub == "*" || sub == subresource)) return true;
    }
  }
  return false;
}

struct Hook {
  std::string configName;
  json webhook;          // one entry of webhooks[]
  bool virtApi = false;  // the built-in stand-in for virt-api's VMI mutator
  std::string Name() const { return virtApi ? kVirtApiWebhook : webhook.value("name", ""); }
};

// A failed call: the webhook's failurePolicy decides (kubernetes/apiserver
// pkg/util/webhook ErrCallingWebhook).
struct CallError {
  std::string reason;
};

size_t Collect(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// POSTs the review to the webhook's clientConfig; returns the parsed answer or throws
// CallError worded as the real server's error.
json CallWebhook(const json& webhook, const json& review,
                 const std::map<std::string, std::pair<std::string, int>>& endpoints,
                 const FakeApiServerOptions& options) {
  static std::once_flag curlInit;
  std::call_once(curlInit, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  const json clientConfig = webhook.value("clientConfig", json::object());
  long timeoutSeconds = 10;
  if (webhook.contains("timeoutSeconds") && webhook["timeoutSeconds"].is_number_integer()) {
    timeoutSeconds = webhook["timeoutSeconds"].get<long>();
  }
  std::string url;
  std::string connectTo;
  std::string missingService;
  if (clientConfig.contains("service") && clientConfig["service"].is_object()) {
    const json& service = clientConfig["service"];
    const std::string ns = service.value("namespace", "");
    const std::string name = service.value("name", "");
    const int port = service.value("port", 443);
    const std::string host = name + "." + ns + ".svc";
    url = "https://" + host + ":" + std::to_string(port) + service.value("path", "");
    auto endpoint = endpoints.find(ns + "/" + name);
    if (endpoint == endpoints.end()) {
      missingService = name;
    } else {
      connectTo = host + ":" + std::to_string(port) + ":" + endpoint->second.first + ":" +
                  std::to_string(endpoint->second.second);
    }
  } else {
    url = clientConfig.value("url", "");
  }
  url += (url.find('?') == std::string::npos ? "?" : "&") + std::string("timeout=") +
         std::to_string(timeoutSeconds) + "s";
  const std::string post = "failed to call webhook: Post \"" + url + "\": ";
  if (!missingService.empty())
    throw CallError{post + "service \"" + missingService + "\" not found"};
  std::string ca;
  try {
    ca = Base64Decode(clientConfig.value("caBundle", ""));
  } catch (const std::invalid_argument& error) {
    throw CallError{post + "caBundle: " + error.what()};
  }
  const std::string body = review.dump();
  std::string answer;
  char errorText[CURL_ERROR_SIZE] = {0};
  CURL* curl = curl_easy_init();
  if (!curl) throw CallError{post + "curl_easy_init failed"};
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Accept: application/json, */*");
  curl_slist* connect = nullptr;
  if (!connectTo.empty()) connect = curl_slist_append(connect, connectTo.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeoutSeconds * 1000);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errorText);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!ca.empty()) {
    // Only the caBundle: no system roots beside it.
    curl_blob blob{ca.data(), ca.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &blob);
    curl_easy_setopt(curl, CURLOPT_CAPATH, nullptr);
  }
  if (connect) curl_easy_setopt(curl, CURLOPT_CONNECT_TO, connect);
  if (!options.webhookClientCertificate.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, options.webhookClientCertificate.c_str());
    curl_easy_setopt(curl, CURLOPT_SSLKEY, options.webhookClientKey.c_str());
  }
  CURLcode code = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  curl_slist_free_all(connect);
  if (code == CURLE_OPERATION_TIMEDOUT) {
    throw CallError{post + "context deadline exceeded (" + errorText + ")"};
  }
  if (code != CURLE_OK) {
    throw CallError{post + (errorText[0] ? errorText : curl_easy_strerror(code))};
  }
  if (status != 200) {
    throw CallError{"failed to call webhook: an error on the server (\"" + answer.substr(0, 200) +
                    "\") has prevented the request from succeeding (code " +
                    std::to_string(status) + ")"};
  }
  json parsed = json::parse(answer, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    throw CallError{"the webhook's answer is not a JSON object"};
  }
  return parsed;
}

// VerifyAdmissionResponse (request/admissionreview.go): returns response or throws CallError.
json VerifiedResponse(const json& answer, const std::string& uid, bool mutating) {
  auto invalid = [](const std::string& what) {
    return CallError{"received invalid webhook response: " + what};
  };
  if (answer.value("apiVersion", "") != "admission.k8s.io/v1" ||
      answer.value("kind", "") != "AdmissionReview") {
    throw invalid("expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got " +
                  answer.value("apiVersion", "") + ", Kind=" + answer.value("kind", ""));
  }
  if (!answer.contains("response") || !answer["response"].is_object()) {
    throw invalid("webhook response was absent");
  }
  const json& response = answer["response"];
  if (response.value("uid", "") != uid) {
    throw invalid("expected response.uid=\"" + uid + "\", got \"" + response.value("uid", "") +
                  "\"");
  }
  const bool hasPatch = response.contains("patch") && !response["patch"].is_null();
  const bool hasPatchType = response.contains("patchType") && !response["patchType"].is_null();
  if (hasPatch && !mutating) throw invalid("validating webhook may not return response.patch");
  if (hasPatch && !hasPatchType) {
    throw invalid("webhook returned response.patch but not response.patchType");
  }
  if (hasPatchType && !hasPatch) {
    throw invalid("webhook returned response.patchType but not response.patch");
  }
  if (hasPatchType && response["patchType"] != "JSONPatch") {
    throw invalid("expected response.patchType to be JSONPatch, got \"" +
                  response["patchType"].dump() + "\"");
  }
  return response;
}

// errors/statuserror.go ToStatusErr.
StatusError Denial(const std::string& name, const json& response) {
  const json result = response.value("status", json::object());
  int code = result.is_object() ? result.value("code", 0) : 0;
  if (code < 400) code = 400;
  const std::string message = result.is_object() ? result.value("message", "") : "";
  const std::string reason = result.is_object() ? result.value("reason", "") : "";
  const std::string deniedBy = "admission webhook \"" + name + "\" denied the request";
  StatusError error{code, reason, deniedBy + " without explanation"};
  if (!message.empty()) {
    error.message = deniedBy + ": " + message;
  } else if (!reason.empty()) {
    error.message = deniedBy + ": " + reason;
  }
  if (result.is_object() && result.contains("details") && result["details"].is_object()) {
    error.details = result["details"];
  }
  return error;
}

void AddWarnings(const json& response, httplib::Response& out) {
  for (const auto& warning : response.value("warnings", json::array())) {
    if (!warning.is_string()) continue;
    std::string text = warning.get<std::string>();
    std::string escaped;
    for (char c : text) {
      if (c == '"' || c == '\\') escaped.push_back('\\');
      escaped.push_back(c);
    }
    out.set_header("Warning", "299 - \"" + escaped + "\"");
  }
}

// A v4-shaped UUID from a counter and the process (webhook request uids must differ).
std::string RequestUid(uint64_t n) {
  char text[40];
  std::snprintf(text, sizeof text, "a0000000-0000-4000-8000-%012llx",
                static_cast<unsigned long long>(n));
  return text;
}

// What virt-api's VMI mutator changes on a create (pkg/virt-api/webhooks/mutating-webhook/
// mutators/vmi-mutator.go): machine type, firmware UUID, the observed-API annotations.
void MutateLikeVirtApi(json& vmi) {
  json& spec = vmi["spec"];
  if (!spec.is_object()) spec = json::object();
  json& domain = spec["domain"];
  if (!domain.is_object()) domain = json::object();
  if (!domain.contains("machine") || !domain["machine"].is_object()) {
    domain["machine"] = json::object();
  }
  if (domain["machine"].value("type", "").empty()) domain["machine"]["type"] = "q35";
  if (!domain.contains("firmware") || !domain["firmware"].is_object()) {
    domain["firmware"] = json::object();
  }
  if (domain["firmware"].value("uuid", "").empty()) {
    // Derived from the name, as virt-api does (a name-based UUID), so it is stable.
    const std::string name = vmi["metadata"].value("name", "");
    uint64_t hash = 1469598103934665603ULL;
    for (char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    char text[40];
    std::snprintf(text, sizeof text, "%08llx-%04llx-5%03llx-8%03llx-%012llx",
                  static_cast<unsigned long long>(hash >> 32),
                  static_cast<unsigned long long>((hash >> 16) & 0xffff),
                  static_cast<unsigned long long>((hash >> 4) & 0xfff),
                  static_cast<unsigned long long>(hash & 0xfff),
                  static_cast<unsigned long long>(hash & 0xffffffffffffULL));
    domain["firmware"]["uuid"] = text;
  }
  json& metadata = vmi["metadata"];
  if (!metadata.contains("annotations") || !metadata["annotations"].is_object()) {
    metadata["annotations"] = json::object();
  }
  metadata["annotations"]["kubevirt.io/latest-observed-api-version"] = "v1";
  metadata["annotations"]["kubevirt.io/storage-observed-api-version"] = "v1";
}

}  // namespace

namespace {

struct Snapshot {
  std::vector<Hook> hooks;
  json namespaceLabels = json::object();
  std::map<std::string, std::pair<std::string, int>> endpoints;
  std::map<std::string, std::vector<int>> endpointSets;

  // The endpoints of one call: a Service with several takes the next of them.
  std::map<std::string, std::pair<std::string, int>> ForCall(std::atomic<uint64_t>& turn) const {
    std::map<std::string, std::pair<std::string, int>> chosen = endpoints;
    for (const auto& [key, ports] : endpointSets) {
      chosen[key] = {"127.0.0.1", ports[turn.fetch_add(1) % ports.size()]};
    }
    return chosen;
  }
};

}  // namespace

// Everything admission reads of the server, taken under the lock at once.
static Snapshot TakeSnapshot(const std::map<std::string, std::map<std::string, json>>& objects,
                             const std::string& plural, const std::string& ns, bool virtApi,
                             const std::map<std::string, std::pair<std::string, int>>& endpoints) {
  Snapshot snapshot;
  snapshot.endpoints = endpoints;
  auto configs = objects.find("admissionregistration.k8s.io/" + plural);
  // The store's keys are "/<name>": configurations in name order, as the real server sorts
  // them (configuration/mutating_webhook_manager.go).
  std::map<std::string, std::vector<Hook>> byConfig;
  if (configs != objects.end()) {
    for (const auto& [key, config] : configs->second) {
      const std::string name = NameOfKey(key);
      for (const auto& webhook : config.value("webhooks", json::array())) {
        if (webhook.is_object()) byConfig[name].push_back(Hook{name, webhook, false});
      }
    }
  }
  if (virtApi) byConfig[kVirtApiConfig].push_back(Hook{kVirtApiConfig, json::object(), true});
  for (auto& [name, hooks] : byConfig) {
    (void)name;
    for (auto& hook : hooks) snapshot.hooks.push_back(std::move(hook));
  }
  if (!ns.empty()) {
    auto namespaces = objects.find("/namespaces");
    if (namespaces != objects.end()) {
      auto it = namespaces->second.find("/" + ns);
      if (it != namespaces->second.end()) snapshot.namespaceLabels = LabelsOf(it->second);
    }
  }
  return snapshot;
}

namespace {

// generic/webhook.go ShouldCallHook: rules, namespaceSelector, objectSelector.
bool ShouldCall(const Hook& hook, const FakeApiServer::Admission& admission,
                const std::string& group, const std::string& version, const std::string& plural,
                bool namespaced, bool isNamespace, const json& namespaceLabels) {
  if (hook.virtApi) {
    return admission.operation == "CREATE" && group == "kubevirt.io" && version == "v1" &&
           plural == "virtualmachineinstances" && admission.subresource.empty();
  }
  bool ruleMatched = false;
  for (const auto& rule : hook.webhook.value("rules", json::array())) {
    if (RuleMatches(rule, admission.operation, group, version, plural, admission.subresource,
                    namespaced)) {
      ruleMatched = true;
      break;
    }
  }
  if (!ruleMatched) return false;
  // namespaceSelector: the namespace's labels; a Namespace's own; other cluster-scoped
  // objects are never skipped by it.
  const json namespaceSelector = hook.webhook.value("namespaceSelector", json::object());
  if (isNamespace) {
    const json& own = admission.object.is_null() ? admission.oldObject : admission.object;
    if (!SelectorMatches(namespaceSelector, LabelsOf(own))) return false;
  } else if (namespaced && !SelectorMatches(namespaceSelector, namespaceLabels)) {
    return false;
  }
  // objectSelector: the object or the old object (a null one does not count).
  const json objectSelector = hook.webhook.value("objectSelector", json::object());
  if (objectSelector.is_object() && !objectSelector.empty()) {
    bool matched = (!admission.object.is_null() &&
                    SelectorMatches(objectSelector, LabelsOf(admission.object))) ||
                   (!admission.oldObject.is_null() &&
                    SelectorMatches(objectSelector, LabelsOf(admission.oldObject)));
    if (!matched) return false;
  }
  return true;
}

json Review(const FakeApiServer::Admission& admission, const std::string& uid,
            const std::string& group, const std::string& version, const std::string& kind,
            const std::string& plural, const json& object) {
  json gvk = {{"group", group}, {"version", version}, {"kind", kind}};
  json gvr = {{"group", group}, {"version", version}, {"resource", plural}};
  json request = {{"uid", uid},
                  {"kind", gvk},
                  {"resource", gvr},
                  {"requestKind", gvk},
                  {"requestResource", gvr},
                  {"operation", admission.operation},
                  {"userInfo", admission.user.ToJson()},
                  {"object", object},
                  {"oldObject", admission.oldObject},
                  {"dryRun", admission.dryRun},
                  {"options", admission.options}};
  if (!admission.subresource.empty()) {
    request["subResource"] = admission.subresource;
    request["requestSubResource"] = admission.subresource;
  }
  if (!admission.name.empty()) request["name"] = admission.name;
  if (!admission.ns.empty()) request["namespace"] = admission.ns;
  return {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"request", request}};
}

// A webhook's failurePolicy is Fail unless it says Ignore.
bool Ignores(const Hook& hook) { return hook.webhook.value("failurePolicy", "Fail") == "Ignore"; }

StatusError CallFailed(const Hook& hook, const std::string& reason) {
  return StatusError{
      500, "InternalError",
      "Internal error occurred: failed calling webhook \"" + hook.Name() + "\": " + reason};
}

}  // namespace

json FakeApiServer::AdmitMutating(const Admission& admission, httplib::Response& response) {
  const ResourceType& type = *admission.type;
  if (type.group == "admissionregistration.k8s.io") return admission.object;  // never admitted
  Snapshot snapshot;
  {
    std::lock_guard lock(mutex_);
    snapshot =
        TakeSnapshot(objects_, "mutatingwebhookconfigurations", type.namespaced ? admission.ns : "",
                     virtApiMutator_, serviceEndpoints_);
    snapshot.endpointSets = serviceEndpointSets_;
  }
  const bool isNamespace = type.group.empty() && type.plural == "namespaces";
  Admission current = admission;
  // mutating/dispatcher.go with the reinvocation context: a webhook with reinvocationPolicy
  // IfNeeded is called once more, after the first round, when a later webhook (or the
  // stand-in) changed the object after its call; the webhook that changed it is not.
  std::set<size_t> previouslyInvoked;  // IfNeeded webhooks called since the last change
  std::set<size_t> reinvoke;
  for (int round = 0; round < 2; ++round) {
    if (round == 1 && reinvoke.empty()) break;
    for (size_t i = 0; i < snapshot.hooks.size(); ++i) {
      const Hook& hook = snapshot.hooks[i];
      if (round == 1 && !reinvoke.count(i)) continue;
      if (!ShouldCall(hook, current, type.group, type.version, type.plural, type.namespaced,
                      isNamespace, snapshot.namespaceLabels)) {
        continue;
      }
      const json before = current.object;
      if (hook.virtApi) {
        MutateLikeVirtApi(current.object);
      } else {
        const std::string sideEffects = hook.webhook.value("sideEffects", "Unknown");
        if (current.dryRun && sideEffects != "None" && sideEffects != "NoneOnDryRun") {
          throw StatusError{400, "BadRequest",
                            "admission webhook \"" + hook.Name() + "\" does not support dry run"};
        }
        try {
          if (!Contains(hook.webhook.value("admissionReviewVersions", json::array()), "v1")) {
            throw CallError{"webhook does not accept known AdmissionReview versions"};
          }
          const std::string uid = RequestUid(++admissionUid_);
          json answer = CallWebhook(hook.webhook,
                                    Review(current, uid, type.group, type.version, type.kind,
                                           type.plural, current.object),
                                    snapshot.ForCall(endpointTurn_), options_);
          json result = VerifiedResponse(answer, uid, /*mutating=*/true);
          AddWarnings(result, response);
          if (!result.value("allowed", false)) throw Denial(hook.Name(), result);
          if (result.contains("patch") && !result["patch"].is_null() && !current.object.is_null()) {
            try {
              json patch = json::parse(Base64Decode(result["patch"].get<std::string>()));
              current.object = current.object.patch(patch);
            } catch (const std::exception& error) {
              throw StatusError{
                  500, "InternalError",
                  std::string("Internal error occurred: JSON Patch: ") + error.what()};
            }
          }
        } catch (const CallError& error) {
          if (Ignores(hook)) continue;
          throw CallFailed(hook, error.reason);
        }
      }
      if (current.object != before) {
        for (size_t earlier : previouslyInvoked) {
          if (earlier != i) reinvoke.insert(earlier);
        }
        previouslyInvoked.clear();
      }
      if (round == 0 && !hook.virtApi &&
          hook.webhook.value("reinvocationPolicy", "Never") == "IfNeeded") {
        previouslyInvoked.insert(i);
      }
    }
  }
  return current.object;
}

void FakeApiServer::AdmitValidating(const Admission& admission, httplib::Response& response) {
  const ResourceType& type = *admission.type;
  if (type.group == "admissionregistration.k8s.io") return;
  Snapshot snapshot;
  {
    std::lock_guard lock(mutex_);
    snapshot = TakeSnapshot(objects_, "validatingwebhookconfigurations",
                            type.namespaced ? admission.ns : "", false, serviceEndpoints_);
    snapshot.endpointSets = serviceEndpointSets_;
  }
  const bool isNamespace = type.group.empty() && type.plural == "namespaces";
  // In order, one at a time (the real server calls them in parallel; none sees another's
  // answer, so only the first denial's wording may differ).
  for (const Hook& hook : snapshot.hooks) {
    if (!ShouldCall(hook, admission, type.group, type.version, type.plural, type.namespaced,
                    isNamespace, snapshot.namespaceLabels)) {
      continue;
    }
    const std::string sideEffects = hook.webhook.value("sideEffects", "Unknown");
    if (admission.dryRun && sideEffects != "None" && sideEffects != "NoneOnDryRun") {
      throw StatusError{400, "BadRequest",
                        "admission webhook \"" + hook.Name() + "\" does not support dry run"};
    }
    try {
      if (!Contains(hook.webhook.value("admissionReviewVersions", json::array()), "v1")) {
        throw CallError{"webhook does not accept known AdmissionReview versions"};
      }
      const std::string uid = RequestUid(++admissionUid_);
      json answer = CallWebhook(hook.webhook,
                                Review(admission, uid, type.group, type.version, type.kind,
                                       type.plural, admission.object),
                                snapshot.ForCall(endpointTurn_), options_);
      json result = VerifiedResponse(answer, uid, /*mutating=*/false);
      AddWarnings(result, response);
      if (!result.value("allowed", false)) throw Denial(hook.Name(), result);
    } catch (const CallError& error) {
      if (Ignores(hook)) continue;
      throw CallFailed(hook, error.reason);
    }
  }
}

}  // namespace cozy::fake
