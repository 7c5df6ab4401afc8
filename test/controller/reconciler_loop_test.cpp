// The reconciler loop's debounce (docs/controller.md, "The binder", "The reconciler gives way under
// a storm"): 50 ms on a cluster whose passes are quick, four times the last pass's time where that
// is longer, and never past a second, so a storm of changes on a large cluster leaves the binder
// most of the cores. And its yield to the binder's answers: a pass due while the binder answers
// bind requests waits for them, a second at most.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "controller/reconciler/loop.h"
#include "runtime/loop.h"

namespace cozy::controller {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Caches that are synced and hold nothing: a pass plans nothing and writes nothing. Notes when
// each pass read them.
class EmptyCaches : public ReconcilerSource {
 public:
  bool ReconcilerCachesSynced() const override { return true; }
  ReconcileInput BuildInput() const override {
    std::lock_guard lock(mutex_);
    if (!firstPass_) firstPass_ = steady_clock::now();
    ++passes_;
    ReconcileInput input;
    input.now = std::chrono::system_clock::now();
    return input;
  }
  int passes() const {
    std::lock_guard lock(mutex_);
    return passes_;
  }
  std::optional<steady_clock::time_point> firstPass() const {
    std::lock_guard lock(mutex_);
    return firstPass_;
  }

 private:
  mutable std::mutex mutex_;
  mutable int passes_ = 0;
  mutable std::optional<steady_clock::time_point> firstPass_;
};

// A reconciler loop on a loop thread of its own, leading, asked for one pass at `asked`; the
// binder "answers" while `busy` holds.
class ReconcilerYield : public ::testing::Test {
 protected:
  void SetUp() override {
    kube::ClientConfig config;
    config.server = "http://127.0.0.1:1";  // never called: nothing is planned
    client_ = std::make_unique<kube::Client>(config);
    reconciler_ = std::make_unique<ReconcilerLoop>(loop_, *client_, leading_, caches_,
                                                   std::chrono::hours(1), nullptr);
    reconciler_->SetYield([this] { return busy_.load(); });
    thread_ = std::thread([this] { loop_.Run(); });
    loop_.Post([this] {
      reconciler_->Start();
      asked_ = steady_clock::now();
      reconciler_->Trigger();
    });
  }
  void TearDown() override {
    loop_.Post([this] {
      reconciler_->Stop();
      loop_.Exit(0);
    });
    thread_.join();
  }
  bool WaitForPass() {
    const auto deadline = steady_clock::now() + std::chrono::seconds(30);
    while (caches_.passes() == 0 && steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    return caches_.passes() > 0;
  }

  runtime::Loop loop_;
  std::unique_ptr<kube::Client> client_;
  kube::Leadership leading_{true};
  std::atomic<bool> busy_{true};
  EmptyCaches caches_;
  std::unique_ptr<ReconcilerLoop> reconciler_;
  std::thread thread_;
  steady_clock::time_point asked_;  // set on the loop thread before the pass can run
};

TEST_F(ReconcilerYield, APassDueWhileTheBinderAnswersWaitsForItsAnswers) {
  std::this_thread::sleep_for(milliseconds(300));  // the binder answers meanwhile
  const auto answered = steady_clock::now();
  busy_ = false;
  ASSERT_TRUE(WaitForPass());
  EXPECT_GE(*caches_.firstPass(), answered) << "the pass ran while the binder answered";
}

TEST_F(ReconcilerYield, APassWaitsForTheBinderASecondAtMost) {
  // The binder answers throughout: the pass runs all the same, a second after it was due.
  ASSERT_TRUE(WaitForPass());
  EXPECT_GE(*caches_.firstPass() - asked_, ReconcilerLoop::kYieldMax);
  EXPECT_TRUE(busy_.load());
}

// C11: a pod's change asks for a pass for its usage records within a second, so pod churn costs
// the reconciler a pass a second at most; any other change's ask pulls the pass forward.
class ReconcilerRecordsC11 : public ::testing::Test {
 protected:
  void SetUp() override {
    kube::ClientConfig config;
    config.server = "http://127.0.0.1:1";  // never called: nothing is planned
    client_ = std::make_unique<kube::Client>(config);
    reconciler_ = std::make_unique<ReconcilerLoop>(loop_, *client_, leading_, caches_,
                                                   std::chrono::hours(1), nullptr);
    thread_ = std::thread([this] { loop_.Run(); });
  }
  void TearDown() override {
    loop_.Post([this] {
      reconciler_->Stop();
      loop_.Exit(0);
    });
    thread_.join();
  }
  // The time from `ask` (run on the loop thread) to the pass it asked for.
  milliseconds Latency(std::function<void(ReconcilerLoop&)> ask) {
    std::atomic<int64_t> asked{0};
    loop_.Post([&] {
      reconciler_->Start();
      asked = steady_clock::now().time_since_epoch().count();
      ask(*reconciler_);
    });
    const auto deadline = steady_clock::now() + std::chrono::seconds(30);
    while (caches_.passes() == 0 && steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    EXPECT_GT(caches_.passes(), 0);
    return std::chrono::duration_cast<milliseconds>(
        *caches_.firstPass() - steady_clock::time_point(steady_clock::duration(asked.load())));
  }

  runtime::Loop loop_;
  std::unique_ptr<kube::Client> client_;
  kube::Leadership leading_{true};
  EmptyCaches caches_;
  std::unique_ptr<ReconcilerLoop> reconciler_;
  std::thread thread_;
};

TEST_F(ReconcilerRecordsC11, APodsChangeAsksForAPassWithinASecond) {
  const milliseconds latency = Latency([](ReconcilerLoop& loop) {
    for (int i = 0; i < 20; ++i) loop.TriggerForRecords();  // a burst of pod changes
  });
  EXPECT_GE(latency, ReconcilerLoop::kRecordsDebounce - milliseconds(5));
  EXPECT_LT(latency, ReconcilerLoop::kRecordsDebounce + milliseconds(900));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(caches_.passes(), 1) << "the burst made more than one pass";
}

TEST_F(ReconcilerRecordsC11, AnyOtherChangePullsThePassForward) {
  const milliseconds latency = Latency([](ReconcilerLoop& loop) {
    loop.TriggerForRecords();
    loop.Trigger();  // a device changed
  });
  EXPECT_LT(latency, milliseconds(500));
}

TEST(ReconcilerLoop, DebounceIsFourTimesTheLastPassBetweenFiftyMillisecondsAndASecond) {
  EXPECT_EQ(ReconcilerLoop::Debounce(0), milliseconds(50)) << "before any pass";
  EXPECT_EQ(ReconcilerLoop::Debounce(0.002), milliseconds(50)) << "a small cluster's pass";
  EXPECT_EQ(ReconcilerLoop::Debounce(0.0125), milliseconds(50));
  EXPECT_EQ(ReconcilerLoop::Debounce(0.05), milliseconds(200)) << "5,000 nodes";
  EXPECT_EQ(ReconcilerLoop::Debounce(0.2), milliseconds(800));
  EXPECT_EQ(ReconcilerLoop::Debounce(0.25), milliseconds(1000));
  EXPECT_EQ(ReconcilerLoop::Debounce(30), milliseconds(1000)) << "capped";
}

}  // namespace
}  // namespace cozy::controller
