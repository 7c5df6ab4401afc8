#include "kube/informer_loop.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <system_error>

#include "runtime/thread_name.h"

namespace cozy::kube {
namespace {

// A member's step that throws (a bug: a cache's step catches what it calls) is tried again a
// second later rather than ending the process on a thread nobody joins yet.
LoopMember::Next StepSafely(LoopMember& member, TimeSource& time, bool mayList) {
  const TimePoint now = time.Now();
  try {
    return member.Step(now, mayList);
  } catch (...) {
    return {now + std::chrono::seconds(1), {}};
  }
}

}  // namespace

InformerLoop::InformerLoop(std::string threadName, TimeSource& time)
    : threadName_(std::move(threadName)),
      time_(time),
      realClock_(dynamic_cast<SystemTimeSource*>(&time) != nullptr),
      listWorkers_("l:idle", std::numeric_limits<size_t>::max()) {
  wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_ < 0) throw std::system_error(errno, std::generic_category(), "informer loop eventfd");
}

InformerLoop::~InformerLoop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  {
    std::unique_lock lock(mutex_);
    for (Entry* queued : toList_) queued->busy = false;  // lists no worker took are not made
    toList_.clear();
    for (Entry& entry : entries_) {
      idle_.wait(lock, [&entry] { return !entry.busy; });
    }
    entries_.clear();
  }
  listWorkers_.Stop();  // no list is left: the jobs still waiting have none to take
  close(wake_);
}

void InformerLoop::Add(LoopMember& member) {
  {
    std::lock_guard lock(mutex_);
    entries_.push_back(Entry{&member, {time_.Now(), {}}, true, false});
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  Wake();
}

void InformerLoop::Remove(LoopMember& member) {
  {
    std::unique_lock lock(mutex_);
    const auto it = std::find_if(entries_.begin(), entries_.end(),
                                 [&member](const Entry& entry) { return entry.member == &member; });
    if (it == entries_.end()) return;
    // A list not yet taken by a worker is dropped; one in flight is waited for.
    if (const auto queued = std::find(toList_.begin(), toList_.end(), &*it);
        queued != toList_.end()) {
      toList_.erase(queued);
    } else {
      idle_.wait(lock, [&it] { return !it->busy; });
    }
    entries_.erase(it);
  }
  Wake();
}

uint64_t InformerLoop::Wakeups() const {
  std::lock_guard lock(mutex_);
  return wakeups_;
}

uint64_t InformerLoop::Lists() const {
  std::lock_guard lock(mutex_);
  return lists_;
}

size_t InformerLoop::ListWorkers() const { return listWorkers_.Threads(); }

void InformerLoop::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof one);
}

void InformerLoop::ListOne() {
  std::unique_lock lock(mutex_);
  if (toList_.empty()) return;  // dropped (Remove, the destructor)
  Entry& entry = *toList_.front();
  toList_.pop_front();
  lock.unlock();
  runtime::NameThisThread("l:" + entry.member->LoopName());
  LoopMember::Next next = StepSafely(*entry.member, time_, true);
  runtime::NameThisThread("l:idle");
  lock.lock();
  entry.next = std::move(next);
  entry.ready = false;
  entry.busy = false;
  idle_.notify_all();
  Wake();
}

void InformerLoop::Run() {
  runtime::NameThisThread(threadName_);
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    ++wakeups_;
    // What is due: a list goes to a list worker; a socket with something or a timer due
    // is stepped here, one member after the other, outside the lock.
    std::vector<Entry*> due;
    TimePoint now = time_.Now();
    for (Entry& entry : entries_) {
      if (entry.busy) continue;
      if (entry.member->ListDue(now)) {
        entry.busy = true;
        ++lists_;
        toList_.push_back(&entry);
        listWorkers_.Submit([this] { ListOne(); });
      } else if (entry.ready || now >= entry.next.at) {
        entry.busy = true;
        due.push_back(&entry);
      }
    }
    lock.unlock();
    for (Entry* entry : due) {
      LoopMember::Next next = StepSafely(*entry->member, time_, false);
      {
        std::lock_guard relock(mutex_);
        entry->next = std::move(next);
        entry->ready = false;
        entry->busy = false;
      }
      idle_.notify_all();
    }
    lock.lock();
    if (stopping_) break;

    // Sleep until a member's timer, a socket's activity or a wake-up, whichever is first. On the
    // real clock nothing polls periodically; an injected clock's wait is capped (see the
    // constructor's comment).
    now = time_.Now();
    Duration wait =
        realClock_ ? Duration(std::chrono::minutes(1)) : Duration(std::chrono::milliseconds(100));
    std::vector<pollfd> polls{{wake_, POLLIN, 0}};
    std::vector<LoopMember*> owners{nullptr};
    for (const Entry& entry : entries_) {
      if (entry.busy) continue;
      wait = entry.ready ? Duration::zero()
                         : std::min(wait, std::max(Duration::zero(), entry.next.at - now));
      for (const auto& fd : entry.next.wakeOn) {
        polls.push_back(
            {fd.fd, static_cast<short>((fd.read ? POLLIN : 0) | (fd.write ? POLLOUT : 0)), 0});
        owners.push_back(entry.member);
      }
    }
    lock.unlock();
    if (realClock_ || polls.size() > 1) {
      // Rounded up: a wait of 0.4 ms is 1 ms, not a busy loop of zero-length polls.
      poll(polls.data(), polls.size(),
           static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    } else if (wait > Duration::zero()) {
      time_.SleepFor(wait);
    }
    if (polls[0].revents != 0) {
      uint64_t count = 0;
      (void)!read(wake_, &count, sizeof count);
    }
    lock.lock();
    for (size_t i = 1; i < polls.size(); ++i) {
      if (polls[i].revents == 0) continue;
      // Matched by member: one removed meanwhile is no longer here.
      for (Entry& entry : entries_) {
        if (entry.member == owners[i] && !entry.busy) entry.ready = true;
      }
    }
  }
}

}  // namespace cozy::kube
