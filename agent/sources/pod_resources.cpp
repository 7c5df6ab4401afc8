#include "agent/sources/pod_resources.h"

#include <random>

#include "runtime/log.h"

namespace cozy::agent {
namespace {

double RandomUnit() {
  static thread_local std::mt19937 generator{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(generator);
}

}  // namespace

PodResourcesSource::PodResourcesSource(podresources::ClientOptions options, FetchSchedule schedule)
    : options_(options), client_(std::move(options)), units_(schedule) {}

PodResourcesSource::~PodResourcesSource() {
  if (worker_) {
    worker_->Stop();
  }
}

void PodResourcesSource::Start(runtime::Loop& loop, Changed changed) {
  loop_ = &loop;
  changed_ = std::move(changed);
  worker_ = std::make_unique<runtime::Worker>("pod-resources");
  timer_ = loop.AddTimer("pod-resources schedule", [this] { Fetch(); });
  Fetch();
}

void PodResourcesSource::Refresh(bool force) {
  if (loop_ == nullptr) {
    return;
  }
  if (inFlight_) {
    again_ = true;
    return;
  }
  if (!force && units_.consecutiveFailures() > 0 && timer_.Armed()) {
    return;  // backing off: the armed retry reads soon enough
  }
  timer_.Cancel();
  Fetch();
}

void PodResourcesSource::Fetch() {
  if (inFlight_) {
    again_ = true;
    return;
  }
  inFlight_ = true;
  ++fetches_;
  worker_->Run([this] {
    podresources::FetchResult result = client_.Fetch();
    loop_->Post([this, result = std::move(result)] { OnAnswer(result); });
  });
}

void PodResourcesSource::OnAnswer(const podresources::FetchResult& result) {
  inFlight_ = false;
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
  if (again_ && units_.consecutiveFailures() == 0) {
    again_ = false;
    Fetch();
  } else {
    again_ = false;
    timer_.Arm(units_.NextFetchDelay(RandomUnit()));
  }
  // A pass only when the answer can change the status: the first one, a new state, a new
  // allocation, or while stale (the staleUnits mark appears once kubelet stays silent long
  // enough). Kubelet is read every 10 s; a quiet node costs no pass for it.
  if (answers_ == 1 || previousState != units_.lastState() || allocationChanged || units_.stale()) {
    changed_("pod-resources answered", false);
  }
}

}  // namespace cozy::agent
