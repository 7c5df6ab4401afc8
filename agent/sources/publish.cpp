#include "agent/sources/publish.h"

#include "runtime/log.h"

namespace cozy::agent {

std::optional<std::chrono::milliseconds> ClientReadyIn(kube::Client& client) {
  const kube::Duration wait = client.rateLimiter().Delay();
  if (wait <= kube::Duration::zero()) {
    return std::nullopt;
  }
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(wait), std::chrono::milliseconds(1));
}

kube::Duration RetryWait(kube::Backoff& backoff, const std::exception& error) {
  kube::Duration wait = backoff.Next();
  if (const auto* api = dynamic_cast<const kube::ApiError*>(&error)) {
    if (api->retryAfter() && *api->retryAfter() > wait) wait = *api->retryAfter();
  }
  return wait;
}

PublishSource::PublishSource(std::unique_ptr<StatusPublisher> publisher, std::string name)
    : publisher_(std::move(publisher)), name_(std::move(name)) {}

PublishSource::~PublishSource() {
  if (worker_) {
    worker_->Stop();
  }
}

void PublishSource::Start(runtime::Loop& loop, Changed /*changed*/) {
  loop_ = &loop;
  worker_ = std::make_unique<runtime::Worker>(name_);
  timer_ = loop.AddTimer("publish retry", [this] { Kick(); });
  Kick();
}

void PublishSource::Refresh(bool /*force*/) {
  if (loop_ == nullptr) {
    return;
  }
  worker_->Run([this] { publisher_->Invalidate(); });
  forced_ = true;
  Kick();
}

void PublishSource::Offer(nlohmann::json status) {
  desired_ = std::move(status);
  Kick();
}

void PublishSource::Kick() {
  if (loop_ == nullptr || inFlight_ || timer_.Armed() || !desired_) {
    return;
  }
  if (!forced_ && confirmed_ && *confirmed_ == *desired_) {
    return;
  }
  // The loop waits for the rate limit on its timer, then writes the status as it is by then:
  // changes in between cost no extra write.
  if (const auto wait = publisher_->ReadyIn()) {
    ++counters_.waits;
    timer_.Arm(*wait);
    return;
  }
  inFlight_ = true;
  forced_ = false;
  worker_->Run([this, status = *desired_]() mutable {
    PublishAttempt attempt;
    try {
      attempt = publisher_->Publish(status);
    } catch (const std::exception& error) {
      runtime::LogError("publishing failed", {{"reason", error.what()}});
      attempt.outcome = PublishAttempt::Outcome::kFailed;
      attempt.retryIn = std::chrono::seconds(1);
    }
    loop_->Post([this, status = std::move(status), attempt] { OnDone(status, attempt); });
  });
}

void PublishSource::OnDone(nlohmann::json status, PublishAttempt attempt) {
  inFlight_ = false;
  switch (attempt.outcome) {
    case PublishAttempt::Outcome::kWritten:
      ++counters_.written;
      confirmed_ = std::move(status);
      break;
    case PublishAttempt::Outcome::kUnchanged:
      ++counters_.unchanged;
      confirmed_ = std::move(status);
      break;
    case PublishAttempt::Outcome::kFailed:
      ++counters_.failed;
      timer_.Arm(std::max(attempt.retryIn, std::chrono::milliseconds(10)));
      return;
  }
  Kick();  // a newer status may have been offered meanwhile
}

}  // namespace cozy::agent
