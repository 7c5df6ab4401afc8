#include "kube/client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kube/watch.h"

namespace cozy::kube {
using nlohmann::json;

namespace {

void GlobalInitOnce() {
  static const bool initialised = [] {
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  }();
  (void)initialised;
}

long Millis(Duration duration) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(duration).count());
}

// The body so far, up to a cap: past it the transfer is aborted (a short count makes libcurl
// stop with CURLE_WRITE_ERROR), so an endless or huge body costs at most the cap.
struct CappedBody {
  std::string* body;
  size_t cap;
  bool overflow = false;
};

size_t AppendBody(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<CappedBody*>(user);
  const size_t bytes = size * count;
  if (bytes > sink->cap - std::min(sink->cap, sink->body->size())) {
    sink->overflow = true;
    return 0;  // anything but `bytes` aborts the transfer
  }
  sink->body->append(data, bytes);
  return bytes;
}

// Keeps the Retry-After header: the only header the client acts on besides Content-Type.
size_t KeepRetryAfter(char* data, size_t size, size_t count, void* user) {
  std::string_view line(data, size * count);
  constexpr std::string_view kName = "retry-after:";
  if (line.size() > kName.size()) {
    std::string lower(line.substr(0, kName.size()));
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == kName) *static_cast<std::string*>(user) = std::string(line.substr(kName.size()));
  }
  return size * count;
}

bool IsIdempotent(const std::string& method, const std::string& contentType) {
  return method == "GET" || method == "PUT" || method == "DELETE" ||
         (method == "PATCH" && contentType == "application/merge-patch+json");
}

std::string JoinQuery(const Query& query) {
  std::string text;
  for (const auto& [key, value] : query) {
    text += text.empty() ? "?" : "&";
    text += key + "=" + EncodeQueryValue(value);
  }
  return text;
}

}  // namespace

void SetRateLimit(ClientOptions& options, double qps, int burst) {
  if (!std::isfinite(qps) || qps < 0) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", qps);
    throw std::invalid_argument(std::string("--qps ") + text +
                                ": not a number of requests a second (0 turns the limit off)");
  }
  if (burst < 1) {
    throw std::invalid_argument("--burst " + std::to_string(burst) + ": must be at least 1");
  }
  options.qps = qps;
  options.burst = burst;
}

std::string EncodeQueryValue(std::string_view value) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (char raw : value) {
    auto c = static_cast<unsigned char>(raw);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

std::string ResourcePath(std::string_view group, std::string_view version, std::string_view plural,
                         std::string_view ns, std::string_view name, std::string_view subresource) {
  std::string path = group.empty() ? "/api/" + std::string(version)
                                   : "/apis/" + std::string(group) + "/" + std::string(version);
  if (!ns.empty()) path += "/namespaces/" + std::string(ns);
  path += "/" + std::string(plural);
  if (!name.empty()) path += "/" + std::string(name);
  if (!subresource.empty()) path += "/" + std::string(subresource);
  return path;
}

struct Client::RawResponse {
  CURLcode code = CURLE_OK;
  std::string curlError;
  long status = 0;
  std::string contentType;
  std::string retryAfter;
  std::string body;
  bool tooLarge = false;  // the body passed maxResponseBytes: the transfer was cut there
};

Client::Client(ClientConfig config, ClientOptions options)
    : config_(std::move(config)),
      options_(std::move(options)),
      time_(options_.time ? options_.time : &DefaultTimeSource()),
      tokens_(config_.token, config_.tokenFile, *time_),
      limiter_(options_.qps, options_.burst, *time_) {
  GlobalInitOnce();
  if (!options_.random) options_.random = DefaultRandomSource();
  while (!config_.server.empty() && config_.server.back() == '/') config_.server.pop_back();
}

Client::~Client() {
  for (void* handle : idleHandles_) curl_easy_cleanup(handle);
}

void* Client::TakeHandle() {
  {
    std::lock_guard lock(handlesMutex_);
    if (!idleHandles_.empty()) {
      void* handle = idleHandles_.back();
      idleHandles_.pop_back();
      curl_easy_reset(handle);  // keeps the connection cache, drops the options
      return handle;
    }
  }
  return curl_easy_init();
}

void Client::ReturnHandle(void* handle) {
  std::lock_guard lock(handlesMutex_);
  idleHandles_.push_back(handle);
}

void* Client::NewConfiguredHandle(const std::string& url, curl_slist** headers,
                                  const std::string& accept) {
  CURL* handle = TakeHandle();
  if (!handle) throw ApiError(ErrorKind::kTransport, 0, "", "curl_easy_init failed", "", url);
  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, Millis(options_.connectTimeout));
  curl_easy_setopt(handle, CURLOPT_USERAGENT, options_.userAgent.c_str());
  curl_easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
  // TLS: the server's CA (file or PEM text), the client's certificate and key.
  if (!config_.caFile.empty()) curl_easy_setopt(handle, CURLOPT_CAINFO, config_.caFile.c_str());
  if (!config_.caData.empty()) {
    curl_blob blob{const_cast<char*>(config_.caData.data()), config_.caData.size(), CURL_BLOB_COPY};
    curl_easy_setopt(handle, CURLOPT_CAINFO_BLOB, &blob);
  }
  if (config_.insecureSkipTlsVerify) {
    curl_easy_setopt(handle, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(handle, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!config_.clientCertFile.empty()) {
    curl_easy_setopt(handle, CURLOPT_SSLCERT, config_.clientCertFile.c_str());
  }
  if (!config_.clientCertData.empty()) {
    curl_blob blob{const_cast<char*>(config_.clientCertData.data()), config_.clientCertData.size(),
                   CURL_BLOB_COPY};
    curl_easy_setopt(handle, CURLOPT_SSLCERT_BLOB, &blob);
  }
  if (!config_.clientKeyFile.empty()) {
    curl_easy_setopt(handle, CURLOPT_SSLKEY, config_.clientKeyFile.c_str());
  }
  if (!config_.clientKeyData.empty()) {
    curl_blob blob{const_cast<char*>(config_.clientKeyData.data()), config_.clientKeyData.size(),
                   CURL_BLOB_COPY};
    curl_easy_setopt(handle, CURLOPT_SSLKEY_BLOB, &blob);
  }
  *headers = curl_slist_append(*headers, ("Accept: " + accept).c_str());
  std::string token = tokens_.Token();
  if (!token.empty()) {
    *headers = curl_slist_append(*headers, ("Authorization: Bearer " + token).c_str());
  }
  return handle;
}

Client::RawResponse Client::PerformOnce(const std::string& method, const std::string& url,
                                        const std::string* body, const std::string& contentType,
                                        Duration timeout) {
  RawResponse response;
  curl_slist* headers = nullptr;
  CURL* handle = nullptr;
  try {
    handle = NewConfiguredHandle(url, &headers, "application/json");
  } catch (const ApiError& e) {
    response.code = CURLE_FAILED_INIT;
    response.curlError = e.what();
    return response;
  }
  char errorBuffer[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, errorBuffer);
  // At least 1 ms: 0 would be no timeout at all.
  curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, std::max(1L, Millis(timeout)));
  curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method == "GET") curl_easy_setopt(handle, CURLOPT_HTTPGET, 1L);
  if (body) {
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body->c_str());
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
    headers = curl_slist_append(headers, ("Content-Type: " + contentType).c_str());
  }
  // No "Expect: 100-continue" round trip for larger bodies.
  headers = curl_slist_append(headers, "Expect:");
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
  CappedBody sink{&response.body, options_.maxResponseBytes};
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &sink);
  // A Content-Length over the cap is refused before the body is read at all.
  curl_easy_setopt(
      handle, CURLOPT_MAXFILESIZE_LARGE,
      static_cast<curl_off_t>(std::min<size_t>(
          options_.maxResponseBytes, static_cast<size_t>(std::numeric_limits<curl_off_t>::max()))));
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, KeepRetryAfter);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &response.retryAfter);
  response.code = curl_easy_perform(handle);
  response.tooLarge = sink.overflow || response.code == CURLE_FILESIZE_EXCEEDED;
  if (response.code != CURLE_OK) {
    response.curlError = errorBuffer[0] ? errorBuffer : curl_easy_strerror(response.code);
  }
  if (response.code == CURLE_OK || response.tooLarge) {
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &response.status);
    char* type = nullptr;
    curl_easy_getinfo(handle, CURLINFO_CONTENT_TYPE, &type);
    if (type) response.contentType = type;
  }
  curl_slist_free_all(headers);
  if (response.code == CURLE_OK) {
    ReturnHandle(handle);
  } else {
    curl_easy_cleanup(handle);  // a broken connection is not worth keeping
  }
  return response;
}

json Client::Request(const std::string& method, const std::string& path, const Query& query,
                     const std::string* body, const std::string& contentType,
                     const RequestOptions& request) {
  const std::string url = config_.server + path + JoinQuery(query);
  const std::string where = path + JoinQuery(query);
  Backoff backoff(options_.retryBackoff, options_.random);
  std::optional<ApiError> error;  // the last attempt's
  for (int attempt = 0;; ++attempt) {
    limiter_.Acquire();
    Duration timeout = options_.requestTimeout;
    if (request.deadline) {
      // Asked now, after the rate limit's wait and right before the attempt: a leader that
      // lost its lease since the last attempt (or during the wait) sends nothing more.
      const std::optional<TimePoint> deadline = request.deadline();
      const Duration left = deadline ? *deadline - time_->Now() : Duration::zero();
      if (left < std::chrono::milliseconds(1)) {
        std::string why = deadline ? "the call's deadline has passed" : "no attempt is allowed now";
        why += attempt == 0 ? ": not sent" : ": not retried after " + std::string(error->what());
        throw ApiError(ErrorKind::kDeadlineExceeded, 0, "", why, method, where);
      }
      timeout = std::min(timeout, left);
    }
    RawResponse response = PerformOnce(method, url, body, contentType, timeout);
    error.reset();
    if (response.tooLarge) {
      // Not retried: the same request would get the same body.
      throw ApiError(ErrorKind::kBadResponse, static_cast<int>(response.status), "",
                     "response body is longer than " + std::to_string(options_.maxResponseBytes) +
                         " bytes (maxResponseBytes); transfer aborted",
                     method, where)
          .MarkResponseTooLarge();
    }
    if (response.code != CURLE_OK) {
      error.emplace(ErrorKind::kTransport, 0, "", response.curlError, method, where);
    } else if (response.status >= 200 && response.status < 300) {
      if (response.body.empty()) return json();
      std::string problem;
      json parsed = ParseNetworkJson(response.body, problem);
      if (!problem.empty()) {
        throw ApiError(ErrorKind::kBadResponse, static_cast<int>(response.status), "",
                       "response body " + problem, method, where);
      }
      return parsed;
    } else {
      error.emplace(ErrorFromResponse(static_cast<int>(response.status), response.contentType,
                                      response.body, response.retryAfter, method, where));
    }
    // A 401 is not retried (client-go does not either), but the next request re-reads the
    // token file, which is where a rotated token shows up.
    if (error->kind() == ErrorKind::kUnauthorized) tokens_.Invalidate();
    bool retryable =
        error->kind() == ErrorKind::kTooManyRequests || error->kind() == ErrorKind::kServerError ||
        (error->kind() == ErrorKind::kTransport &&
         (IsIdempotent(method, contentType) || response.code == CURLE_COULDNT_CONNECT));
    if (!retryable || attempt >= options_.maxRetries) throw *error;
    Duration wait = backoff.Next();
    if (auto after = error->retryAfter()) {
      if (*after > options_.maxRetryAfter) throw *error;
      wait = *after;
    }
    if (request.deadline) {
      // No retry past the deadline: one whose wait reaches it is not made, nor slept for.
      const std::optional<TimePoint> deadline = request.deadline();
      if (!deadline || wait + std::chrono::milliseconds(1) > *deadline - time_->Now()) {
        throw *error;
      }
    }
    time_->SleepFor(wait);
  }
}

json Client::Get(const std::string& path, const Query& query) {
  return Request("GET", path, query);
}

namespace {

Query WriteQuery(const WriteOptions& options) {
  Query query;
  if (options.dryRun) query.emplace_back("dryRun", "All");
  if (!options.fieldManager.empty()) query.emplace_back("fieldManager", options.fieldManager);
  return query;
}

}  // namespace

json DeleteOptionsBody(const DeleteOptions& options) {
  json body = json::object();
  if (options.dryRun) body["dryRun"] = json::array({"All"});
  if (!options.preconditionUid.empty()) body["preconditions"]["uid"] = options.preconditionUid;
  if (!options.preconditionResourceVersion.empty()) {
    body["preconditions"]["resourceVersion"] = options.preconditionResourceVersion;
  }
  if (!options.propagationPolicy.empty()) body["propagationPolicy"] = options.propagationPolicy;
  if (options.gracePeriodSeconds) body["gracePeriodSeconds"] = *options.gracePeriodSeconds;
  if (body.empty()) return nullptr;
  body["kind"] = "DeleteOptions";
  body["apiVersion"] = "v1";
  return body;
}

json Client::Create(const std::string& collectionPath, const json& object,
                    const WriteOptions& options) {
  std::string body = object.dump();
  return Request("POST", collectionPath, WriteQuery(options), &body, "application/json",
                 options.request);
}

json Client::Update(const std::string& path, const json& object, const WriteOptions& options) {
  std::string body = object.dump();
  return Request("PUT", path, WriteQuery(options), &body, "application/json", options.request);
}

json Client::MergePatch(const std::string& path, const json& patch, const WriteOptions& options) {
  std::string body = patch.dump();
  return Request("PATCH", path, WriteQuery(options), &body, "application/merge-patch+json",
                 options.request);
}

json Client::MergePatchAt(const std::string& path, json patch, const std::string& resourceVersion,
                          const WriteOptions& options) {
  if (!patch.is_object()) patch = json::object();
  if (!patch.contains("metadata") || !patch["metadata"].is_object()) {
    patch["metadata"] = json::object();
  }
  patch["metadata"]["resourceVersion"] = resourceVersion;
  return MergePatch(path, patch, options);
}

json Client::JsonPatch(const std::string& path, const json& operations,
                       const WriteOptions& options) {
  std::string body = operations.dump();
  return Request("PATCH", path, WriteQuery(options), &body, "application/json-patch+json",
                 options.request);
}

json Client::Delete(const std::string& path, const DeleteOptions& options) {
  Query query;
  if (options.dryRun) query.emplace_back("dryRun", "All");
  const json body = DeleteOptionsBody(options);
  if (body.is_null()) return Request("DELETE", path, query, nullptr, "", options.request);
  const std::string text = body.dump();
  return Request("DELETE", path, query, &text, "application/json", options.request);
}

namespace {

// What is wrong with a list page for the shape List promises, or "" when nothing is.
std::string ListProblem(const json& list) {
  if (!list.is_object()) return "the list is " + JsonTypeName(list) + ", not an object";
  const auto metadata = list.find("metadata");
  if (metadata == list.end()) return "the list has no metadata";
  if (!metadata->is_object()) return "metadata is " + JsonTypeName(*metadata) + ", not an object";
  const auto version = metadata->find("resourceVersion");
  if (version == metadata->end()) return "metadata.resourceVersion is missing";
  if (!version->is_string()) {
    return "metadata.resourceVersion is " + JsonTypeName(*version) + ", not a string";
  }
  const auto next = metadata->find("continue");
  if (next != metadata->end() && !next->is_string()) {
    return "metadata.continue is " + JsonTypeName(*next) + ", not a string";
  }
  const auto items = list.find("items");
  if (items == list.end() || items->is_null()) return "";
  if (!items->is_array()) return "items is " + JsonTypeName(*items) + ", not an array";
  for (size_t i = 0; i < items->size(); ++i) {
    const json& item = (*items)[i];
    const std::string where = "items[" + std::to_string(i) + "]";
    if (!item.is_object()) return where + " is " + JsonTypeName(item) + ", not an object";
    const auto itemMetadata = item.find("metadata");
    if (itemMetadata == item.end()) continue;
    if (!itemMetadata->is_object()) {
      return where + ".metadata is " + JsonTypeName(*itemMetadata) + ", not an object";
    }
    for (const char* field : {"name", "namespace", "resourceVersion"}) {
      const auto value = itemMetadata->find(field);
      if (value != itemMetadata->end() && !value->is_string()) {
        return where + ".metadata." + field + " is " + JsonTypeName(*value) + ", not a string";
      }
    }
  }
  return "";
}

}  // namespace

json Client::List(const std::string& collectionPath, const ListOptions& options) {
  json whole;
  json metadata = ListPages(collectionPath, options, [&whole](json& page) {
    if (whole.is_null()) {
      whole = std::move(page);  // the first page, kind and apiVersion included
      return;
    }
    for (auto& item : page["items"]) whole["items"].push_back(std::move(item));
  });
  whole["metadata"] = std::move(metadata);
  return whole;
}

json Client::ListPages(const std::string& collectionPath, const ListOptions& options,
                       const std::function<void(json& page)>& onPage) {
  Query query;
  if (!options.labelSelector.empty()) query.emplace_back("labelSelector", options.labelSelector);
  if (!options.fieldSelector.empty()) query.emplace_back("fieldSelector", options.fieldSelector);
  if (!options.resourceVersion.empty()) {
    query.emplace_back("resourceVersion", options.resourceVersion);
  }
  // A page over the response cap (pods of tens of KB: managed fields, last-applied
  // annotations, many env vars) is asked for again, from the same place, with half as many
  // objects, until it fits; the smaller size holds for the rest of the list. The API server
  // stores no object over etcd's 1.5 MiB, so a page of one always fits the default 16 MiB.
  int limit = options.limit;
  auto checked = [&](const std::string& continueToken) {
    for (;;) {
      Query pageQuery = query;
      if (limit > 0) pageQuery.emplace_back("limit", std::to_string(limit));
      if (!continueToken.empty()) pageQuery.emplace_back("continue", continueToken);
      json page;
      try {
        page = Request("GET", collectionPath, pageQuery);
      } catch (const ApiError& error) {
        if (!error.responseTooLarge() || limit <= 1) throw;
        const int smaller = limit / 2;
        if (options.onPageHalved) options.onPageHalved(limit, smaller);
        limit = smaller;
        continue;
      }
      if (std::string problem = ListProblem(page); !problem.empty()) {
        throw ApiError(ErrorKind::kBadResponse, 200, "", "list: " + problem, "GET",
                       collectionPath + JoinQuery(pageQuery));
      }
      if (!page.contains("items") || page["items"].is_null()) page["items"] = json::array();
      return page;
    }
  };
  json page = checked("");
  json metadata = page["metadata"];
  // Follow `continue` with the same query: every page shares the first page's snapshot.
  std::string next = page["metadata"].value("continue", "");
  onPage(page);
  while (!next.empty()) {
    page = checked(next);
    next = page["metadata"].value("continue", "");
    onPage(page);
  }
  metadata.erase("continue");
  metadata.erase("remainingItemCount");
  return metadata;
}

std::unique_ptr<WatchStream> Client::Watch(const std::string& collectionPath,
                                           const WatchOptions& options) {
  Query query{{"watch", "1"}};
  if (!options.labelSelector.empty()) query.emplace_back("labelSelector", options.labelSelector);
  if (!options.fieldSelector.empty()) query.emplace_back("fieldSelector", options.fieldSelector);
  if (!options.resourceVersion.empty()) {
    query.emplace_back("resourceVersion", options.resourceVersion);
  }
  if (options.allowWatchBookmarks) query.emplace_back("allowWatchBookmarks", "true");
  if (options.timeoutSeconds > 0) {
    query.emplace_back("timeoutSeconds", std::to_string(options.timeoutSeconds));
  }
  limiter_.Acquire();
  std::string path = collectionPath + JoinQuery(query);
  // A server that vanishes without closing the connection must not hang the watch forever.
  long timeoutMs = options.timeoutSeconds > 0 ? (options.timeoutSeconds + 30) * 1000L : 0L;
  std::unique_ptr<WatchStream> stream(
      new WatchStream(*this, path, config_.server + path, timeoutMs));
  stream->skim_ = options.skim;
  return stream;
}

}  // namespace cozy::kube
