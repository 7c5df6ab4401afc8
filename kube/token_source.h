// The bearer token, re-read from its file as client-go does: bound service-account tokens
// rotate (kubelet renews them at ~80% of their life), so a token is never cached for good.
#pragma once

#include <mutex>
#include <string>

#include "kube/clock.h"

namespace cozy::kube {

class TokenSource {
 public:
  // client-go caches for a minute with 10 s of leeway: re-read once the copy is 50 s old.
  static constexpr Duration kMaxAge = std::chrono::seconds(50);

  // A fixed token (kubeconfig `token`), or a file (`tokenFile`, in-cluster) when `file` is set.
  TokenSource(std::string token, std::string file, TimeSource& time);

  // The token to send now ("" for none). Re-reads the file when the copy is too old or was
  // invalidated; a failed re-read keeps the last good token (client-go logs and carries on).
  std::string Token();
  // After a 401: the next Token() re-reads the file.
  void Invalidate();
  // Why the last re-read failed, empty if it did not.
  std::string LastError() const;

 private:
  std::string fixed_;
  std::string file_;
  TimeSource& time_;
  mutable std::mutex mutex_;
  std::string cached_;
  TimePoint readAt_{};
  bool valid_ = false;
  std::string lastError_;
};

}  // namespace cozy::kube
