#include "runtime/manager.h"

#include <exception>
#include <stdexcept>
#include <utility>

#include "runtime/log.h"

namespace cozy::runtime {

void Manager::Add(Runnable runnable) {
  if (begun_) throw std::logic_error("Manager::Add after Start: " + runnable.name);
  runnables_.push_back(std::move(runnable));
}

void Manager::Add(std::string name, std::function<void()> start, std::function<void()> stop) {
  Runnable runnable;
  runnable.name = std::move(name);
  runnable.start = std::move(start);
  runnable.stop = std::move(stop);
  Add(std::move(runnable));
}

void Manager::Start() {
  begun_ = true;
  while (started_ < runnables_.size()) {
    const Runnable& runnable = runnables_[started_];
    try {
      if (runnable.start) runnable.start();
    } catch (...) {
      Stop();
      throw;
    }
    ++started_;
  }
}

void Manager::Stop() {
  while (started_ > 0) {
    const Runnable& runnable = runnables_[started_ - 1];
    --started_;
    try {
      if (runnable.stop) runnable.stop();
    } catch (const std::exception& error) {
      LogWarning("stopping failed",
                 LogFields{{"runnable", runnable.name}, {"error", error.what()}});
    }
  }
}

bool Manager::Ready() const { return started_ == runnables_.size() && begun_ && Waiting().empty(); }

std::vector<std::string> Manager::Waiting() const {
  std::vector<std::string> waiting;
  for (size_t i = 0; i < runnables_.size(); ++i) {
    const Runnable& runnable = runnables_[i];
    if (!runnable.gatesReadiness) continue;
    if (i >= started_ || (runnable.synced && !runnable.synced())) waiting.push_back(runnable.name);
  }
  return waiting;
}

void Manager::Lead() const {
  if (!begun_) return;  // the list is complete only from Start on
  for (const Runnable& runnable : runnables_) {
    if (runnable.needsLease && runnable.lead) runnable.lead();
  }
}

std::vector<std::string> Manager::Names() const {
  std::vector<std::string> names;
  for (const Runnable& runnable : runnables_) names.push_back(runnable.name);
  return names;
}

}  // namespace cozy::runtime
