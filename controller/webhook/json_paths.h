// What the webhooks' I/O shares: the GPUDevice paths, a string read at a JSON path, the review
// encoding, the clock they time by.
#pragma once

#include <chrono>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "api/time.h"
#include "controller/admission/review.h"
#include "controller/kinds.h"

namespace cozy::controller::webhook {

using Clock = std::chrono::steady_clock;

inline std::string Collection(const std::string& ns) { return kGpuDevices.Path(ns); }
inline std::string DevicePath(const std::string& ns, const std::string& name, bool status = false) {
  return kGpuDevices.Path(ns, name, status ? "status" : "");
}

inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The value at `path`, or null where a step is missing or not an object.
inline const nlohmann::json* Find(const nlohmann::json& object,
                                  std::initializer_list<const char*> path) {
  const nlohmann::json* at = &object;
  for (const char* key : path) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(key);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

// The string at `path`; empty where there is none.
inline std::string StringAt(const nlohmann::json& object, std::initializer_list<const char*> path) {
  const nlohmann::json* at = Find(object, path);
  return at && at->is_string() ? at->get<std::string>() : "";
}

inline nlohmann::json Encode(const admission::AdmissionResponse& response) {
  return admission::EncodeAdmissionReview(response);
}

inline std::string NowText() { return api::FormatTime(std::chrono::system_clock::now()); }

}  // namespace cozy::controller::webhook
