// Reading past the cache (D3), for the binder (controller/binder/binder.h).
//
// Reading past the cache (D3): a watch event may lag a write, and a pass that planned from a
// cache still showing a unit free would book it again. The binder remembers (here), for each device
// it wrote, the resourceVersions its writes replaced and the device as the API server answered the
// last of them (a write's answer is the object it made: a read past the cache that costs no
// request, as kube-scheduler assumes a pod bound before its informer shows it). A device the
// cache still shows at such a version is stale, and the pass plans from the write's answer
// instead; one whose answer did not decode is read from the API server (a GET). The cost is
// bounded by the binder's own recent writes, never by the size of the cluster, and it is paid
// only while the watch has not delivered them. (Before, every stale device cost a wait of up
// to 200 ms for the watch and, past it, a GET.)
//
// A new leader (D3 across a leader change): its cache may still lag the writes of the leader
// before it, which its own markers know nothing of. Before its first pass it lists the devices
// from the API server (Resync) and marks every device the cache shows otherwise (an older
// version, missing, or deleted since); a marked device is read past, one GET a pass, until the
// cache shows the version the server has.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/gpudevice.h"
#include "controller/model/shared_vector.h"
#include "kube/client.h"

namespace cozy::controller {

// The binder's thread only.
class ReadPastCache {
 public:
  explicit ReadPastCache(kube::Client& client) : client_(client) {}

  // After taking the lead: `cached` as the cache showed it before `listed` was read from the API
  // server. Marks each device whose cached copy differs from the list (D3 across a leader
  // change); returns the number marked.
  int Resync(const std::vector<std::shared_ptr<const api::GpuDevice>>& cached,
             const std::vector<api::GpuDevice>& listed);

  // A device's copy in the cache now, by "namespace/name" (null: none).
  using CachedLookup = std::function<std::shared_ptr<const api::GpuDevice>(const std::string& key)>;
  // The devices ("namespace/name") the cache shows without a write of this binder or of the
  // leader before it (D3), the cache read by key: one lookup per device written, not a walk of
  // every device cached.
  std::vector<std::string> StaleInCache(const CachedLookup& cached);
  // Of `stale` (StaleInCache's), those ReadPast will read from the API server: the devices
  // the last leader wrote (a leader change), and those its own write has no answer for that
  // decodes (each answer is decoded here, once). The rest it takes from those answers.
  std::vector<std::string> NeedReading(const std::vector<std::string>& stale);
  // Of `stale` (NeedReading's), those the cache still shows stale, each read by key through
  // `cached` (a device's copy in the cache now; null: none): how a pass waits for the watch
  // to deliver the writes it has no answer to without reading the whole cache again at each
  // change.
  std::vector<std::string> StillStale(const std::vector<std::string>& stale,
                                      const CachedLookup& cached) const;
  // The devices as the pass must see them: the cache's, with each stale one taken from the
  // answer to the binder's last write of it or, without one, read from the API server (left
  // out when it is gone, added when the cache does not have it yet). Returns the number read
  // from the API server; `fromOwnWrites`, where given, is set to the number taken from answers.
  int ReadPast(const std::vector<std::shared_ptr<const api::GpuDevice>>& cached,
               const std::vector<std::string>& stale, model::SharedVector<api::GpuDevice>& devices,
               int* fromOwnWrites = nullptr);

  // A placement write of device `key` applied: it replaced `replacedVersion`, and the server
  // answered `answer` (the device as it made it).
  void Wrote(const std::string& key, const std::string& replacedVersion,
             std::shared_ptr<const nlohmann::json> answer);

 private:
  // A device this binder wrote and the cache may not show yet (D3): the versions its writes
  // replaced (more than one where a pass wrote from the answer to the one before), the
  // server's answer to the last write, and that answer decoded, once a pass has needed it.
  struct Written {
    std::vector<std::string> replaced;
    std::shared_ptr<const nlohmann::json> answer;
    std::string answerVersion;  // the resourceVersion the answer shows
    std::shared_ptr<const api::GpuDevice> device;
  };
  // The device as the answer to the binder's last write of it shows it; null where there is no
  // answer or it does not decode (the pass reads the device from the API server then).
  static std::shared_ptr<const api::GpuDevice> Answered(Written& written);

  kube::Client& client_;
  std::map<std::string, Written> written_;  // "ns/name" ->
  // "ns/name" -> the version the cache showed when the list after taking the lead differed
  // ("" for a device the cache did not have); dropped once the cache shows the server's.
  std::map<std::string, std::string> unsettled_;
};

}  // namespace cozy::controller
