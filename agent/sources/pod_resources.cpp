#include "agent/sources/pod_resources.h"

#include <random>

#include "runtime/log.h"

namespace cozy::agent {
namespace {

// How soon a read asked for by a trigger starts (see Refresh).
constexpr std::chrono::milliseconds kSoon(1);

double RandomUnit() {
  static thread_local std::mt19937 generator{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(generator);
}

}  // namespace

PodResourcesSource::PodResourcesSource(podresources::ClientOptions options, FetchSchedule schedule)
    : options_(options), client_(std::move(options)), units_(schedule) {}

PodResourcesSource::~PodResourcesSource() {
  if (reads_) {
    reads_->Stop();
  }
}

void PodResourcesSource::Start(runtime::Loop& loop, Changed changed) {
  loop_ = &loop;
  changed_ = std::move(changed);
  reads_ = std::make_unique<runtime::PassLoop<podresources::FetchResult>>(
      loop, "pod-resources schedule", "pod-resources",
      [this] {
        ++fetches_;
        return std::function<podresources::FetchResult()>([this] { return client_.Fetch(); });
      },
      [this](const podresources::FetchResult& result) { OnAnswer(result); });
  reads_->Start();
  reads_->Ask(std::chrono::milliseconds(0));
}

void PodResourcesSource::Refresh(bool force) {
  if (!reads_) {
    return;
  }
  // An ask for now goes past the backoff's hold-off, so only a forced read outside a read asks
  // for now. Any other ask waits for the hold-off: one while kubelet is backed off rides on the
  // armed retry, and one during a read is the read after it, at once after an answer, at the
  // retry after a failure (PassScheduler).
  const bool now = force && !reads_->Running();
  reads_->Ask(now ? std::chrono::milliseconds(0) : kSoon);
}

void PodResourcesSource::OnAnswer(const podresources::FetchResult& result) {
  ++answers_;
  const podresources::FetchState previousState = units_.lastState();
  const bool allocationChanged =
      result.allocation.has_value() && result.allocation != lastAllocation_;
  if (result.allocation) {
    lastAllocation_ = result.allocation;
  }
  units_.Update(result);
  const std::string state(podresources::ToString(units_.lastState()));
  ++results_[state];
  if (state != lastState_) {
    if (units_.lastState() == podresources::FetchState::kOk) {
      runtime::LogInfo("pod-resources answers", {{"endpoint", options_.endpoint}});
    } else {
      runtime::LogWarning(units_.known() ? "pod-resources failed; keeping the last counts, stale"
                                         : "pod-resources failed; units unknown",
                          {{"state", state}, {"detail", units_.lastMessage()}});
    }
    lastState_ = state;
  }
  // The next read: after the interval (sooner when asked), or after the backoff, which holds off
  // every ask but a forced one.
  const std::chrono::milliseconds next = units_.NextFetchDelay(RandomUnit());
  if (units_.consecutiveFailures() == 0) {
    reads_->Finished();
    reads_->Ask(next);
  } else {
    reads_->Finished(next);
  }
  // A pass only when the answer can change the status: the first one, a new state, a new
  // allocation, or while stale (the staleUnits mark appears once kubelet stays silent long
  // enough). Kubelet is read every 10 s; a quiet node costs no pass for it.
  if (answers_ == 1 || previousState != units_.lastState() || allocationChanged || units_.stale()) {
    changed_("pod-resources answered", false);
  }
}

}  // namespace cozy::agent
