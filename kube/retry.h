// client-go's retry.RetryOnConflict: run a read-modify-write again, from a fresh read, when
// the write lost a race (409 Conflict on a stale resourceVersion), a bounded number of times
// with a short backoff in between.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "kube/backoff.h"
#include "kube/client.h"
#include "kube/clock.h"
#include "kube/errors.h"

namespace cozy::kube {

// client-go's retry.DefaultRetry: 5 tries, 10 ms apart, jitter 0.1.
struct ConflictRetry {
  int steps = 5;  // tries in all, the first one included
  BackoffPolicy backoff{std::chrono::milliseconds(10), std::chrono::seconds(1), 1.0, 0.1};
};

// Calls `attempt` until it returns without throwing an ApiError of kind kConflict, at most
// `retry.steps` times, sleeping (on `time`) between tries. The last conflict, and any other
// exception at once, goes to the caller. `attempt` must re-read what it writes: a retry of
// the same stale object would only conflict again.
template <class Attempt>
auto RetryOnConflict(TimeSource& time, Attempt&& attempt, const ConflictRetry& retry = {})
    -> decltype(attempt()) {
  Backoff backoff(retry.backoff);
  for (int step = 1;; ++step) {
    try {
      return attempt();
    } catch (const ApiError& error) {
      if (error.kind() != ErrorKind::kConflict || step >= retry.steps) throw;
    }
    time.SleepFor(backoff.Next());
  }
}

// The usual read-modify-write: GET `path`, let `mutate` change the object, PUT it back
// (conditional on the resourceVersion just read); on a conflict, all of it again from the
// GET. Returns the object as stored. `mutate` may run several times, each time on a fresh
// copy of the server's object.
nlohmann::json UpdateWithRetry(Client& client, const std::string& path,
                               const std::function<void(nlohmann::json&)>& mutate,
                               const WriteOptions& options = {}, const ConflictRetry& retry = {});

}  // namespace cozy::kube
