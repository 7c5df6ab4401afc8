#include "controller/binder/read_past.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "controller/binder/device_key.h"
#include "controller/kinds.h"
#include "kube/errors.h"

namespace cozy::controller {
namespace {

// The resourceVersion an API answer shows ("" where it shows none).
std::string ResourceVersionOf(const nlohmann::json* object) {
  if (!object || !object->is_object()) return "";
  const auto metadata = object->find("metadata");
  if (metadata == object->end() || !metadata->is_object()) return "";
  const auto version = metadata->find("resourceVersion");
  return version != metadata->end() && version->is_string() ? version->get<std::string>() : "";
}

// Whether `version` is one a write of the binder's replaced (the cache has not shown it yet).
template <typename Written>
bool Replaced(const Written& written, const std::string& version) {
  return std::find(written.replaced.begin(), written.replaced.end(), version) !=
         written.replaced.end();
}

}  // namespace

int ReadPastCache::Resync(const std::vector<std::shared_ptr<const api::GpuDevice>>& cached,
                          const std::vector<api::GpuDevice>& listed) {
  std::unordered_map<std::string, const std::string*> versions;
  versions.reserve(cached.size());
  for (const auto& device : cached) {
    versions[DeviceKey(device->metadata)] = &device->metadata.resourceVersion;
  }
  unsettled_.clear();
  for (const api::GpuDevice& device : listed) {
    const std::string key = DeviceKey(device.metadata);
    auto found = versions.find(key);
    if (found == versions.end()) {
      unsettled_[key] = "";  // on the server, not yet in the cache
    } else {
      if (*found->second != device.metadata.resourceVersion) unsettled_[key] = *found->second;
      versions.erase(found);
    }
  }
  for (const auto& [key, version] : versions) {
    unsettled_[key] = *version;  // in the cache, deleted on the server since
  }
  return static_cast<int>(unsettled_.size());
}

std::vector<std::string> ReadPastCache::StaleInCache(const CachedLookup& cached) {
  std::vector<std::string> stale;
  for (auto it = written_.begin(); it != written_.end();) {
    const std::shared_ptr<const api::GpuDevice> device = cached(it->first);
    if (device && Replaced(it->second, device->metadata.resourceVersion)) {
      stale.push_back(it->first);  // still a version our writes replaced
      ++it;
    } else {
      it = written_.erase(it);  // the cache has moved on (or the device is gone)
    }
  }
  // After a leader change, read past each until ReadPast finds the cache showing the server's
  // version.
  const std::unordered_set<std::string> already(stale.begin(), stale.end());
  for (const auto& [key, version] : unsettled_) {
    if (!already.contains(key)) stale.push_back(key);
  }
  return stale;
}

std::shared_ptr<const api::GpuDevice> ReadPastCache::Answered(Written& written) {
  if (!written.device && written.answer) {
    try {
      written.device =
          std::make_shared<const api::GpuDevice>(api::GpuDeviceFromJson(*written.answer));
    } catch (const std::exception&) {
      // Written, but the answer does not say what the device is now: read it instead.
    }
    written.answer.reset();
  }
  return written.device;
}

std::vector<std::string> ReadPastCache::NeedReading(const std::vector<std::string>& stale) {
  std::vector<std::string> reading;
  for (const std::string& key : stale) {
    auto written = written_.find(key);
    if (unsettled_.contains(key) || written == written_.end() || !Answered(written->second)) {
      reading.push_back(key);
    }
  }
  return reading;
}

std::vector<std::string> ReadPastCache::StillStale(const std::vector<std::string>& stale,
                                                   const CachedLookup& cached) const {
  std::vector<std::string> still;
  for (const std::string& key : stale) {
    if (unsettled_.contains(key)) {
      still.push_back(key);  // settled by ReadPast alone (a leader change)
      continue;
    }
    auto written = written_.find(key);
    if (written == written_.end()) continue;
    const std::shared_ptr<const api::GpuDevice> device = cached(key);
    if (device && Replaced(written->second, device->metadata.resourceVersion)) {
      still.push_back(key);
    }
  }
  return still;
}

int ReadPastCache::ReadPast(const std::vector<std::shared_ptr<const api::GpuDevice>>& cached,
                            const std::vector<std::string>& stale,
                            model::SharedVector<api::GpuDevice>& devices, int* fromOwnWrites) {
  if (fromOwnWrites) *fromOwnWrites = 0;
  if (stale.empty()) {
    devices = model::SharedVector<api::GpuDevice>::Sharing(cached);  // the cache's own
    return 0;
  }
  std::unordered_map<std::string, std::optional<api::GpuDevice>> fresh;
  // The stale devices the answers to this binder's own writes show: no request.
  std::unordered_map<std::string, std::shared_ptr<const api::GpuDevice>> answered;
  int read = 0;
  for (const std::string& key : stale) {
    if (!unsettled_.contains(key)) {
      auto written = written_.find(key);
      if (written != written_.end()) {
        if (auto device = Answered(written->second)) {
          answered.emplace(key, std::move(device));
          continue;
        }
      }
    }
    ++read;
    const size_t slash = key.find('/');
    try {
      fresh[key] = api::GpuDeviceFromJson(
          client_.Get(kGpuDevices.Path(key.substr(0, slash), key.substr(slash + 1))));
    } catch (const kube::ApiError& error) {
      if (error.kind() != kube::ErrorKind::kNotFound) throw;
      fresh[key] = std::nullopt;  // deleted since
    } catch (const std::exception&) {
      // The server's version does not decode (as a cache would skip it): plan from the cached
      // copy, which did; the cache will skip the new version too.
      fresh.erase(key);
    }
    // The marker stays until the cache itself moves past the version: every pass until then
    // reads the device again rather than plan from the stale copy.
  }
  // Only the stale devices' keys are built: the rest are found not stale by their names' views.
  std::unordered_set<DeviceName, DeviceNameHash> staleNames;
  for (const std::string& key : stale) staleNames.insert(SplitKey(key));
  devices.clear();
  devices.reserve(cached.size());
  for (const auto& device : cached) {
    if (!staleNames.contains(DeviceName{device->metadata.namespaceName, device->metadata.name})) {
      devices.push_back(device);  // the cache's own, shared
      continue;
    }
    const std::string key = DeviceKey(device->metadata);
    if (!answered.empty()) {
      auto answer = answered.find(key);
      if (answer != answered.end()) {
        // The write's answer, shared; unless the cache (read after `stale` was) has moved on.
        auto written = written_.find(key);
        const bool behind = written != written_.end() &&
                            Replaced(written->second, device->metadata.resourceVersion);
        devices.push_back(behind ? answer->second : device);
        continue;
      }
    }
    auto found = fresh.find(key);
    if (found == fresh.end()) {
      devices.push_back(device);  // the cache's own, shared
      continue;
    }
    if (found->second) {
      devices.push_back(*found->second);
      if (found->second->metadata.resourceVersion == device->metadata.resourceVersion) {
        unsettled_.erase(key);  // the cache shows what the server has
      }
    }
    fresh.erase(found);
  }
  for (const std::string& key : stale) {  // in the order read, so every pass plans alike
    auto found = fresh.find(key);
    if (found == fresh.end()) continue;
    if (found->second) {
      devices.push_back(std::move(*found->second));  // the cache does not have it yet
    } else {
      unsettled_.erase(key);  // gone from both
    }
  }
  if (fromOwnWrites) *fromOwnWrites = static_cast<int>(answered.size());
  return read;
}

void ReadPastCache::Wrote(const std::string& key, const std::string& replacedVersion,
                          std::shared_ptr<const nlohmann::json> answer) {
  Written& written = written_[key];
  // A write planned from the answer to the last one: the cache may still show either version.
  if (written.answerVersion != replacedVersion) written.replaced.clear();
  written.replaced.push_back(replacedVersion);
  written.answer = std::move(answer);
  written.answerVersion = ResourceVersionOf(written.answer.get());
  written.device.reset();
}

}  // namespace cozy::controller
