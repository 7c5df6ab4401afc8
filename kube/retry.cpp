#include "kube/retry.h"

namespace cozy::kube {

nlohmann::json UpdateWithRetry(Client& client, const std::string& path,
                               const std::function<void(nlohmann::json&)>& mutate,
                               const WriteOptions& options, const ConflictRetry& retry) {
  return RetryOnConflict(
      client.time(),
      [&] {
        nlohmann::json object = client.Get(path);
        mutate(object);
        return client.Update(path, object, options);
      },
      retry);
}

}  // namespace cozy::kube
