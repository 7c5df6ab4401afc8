// The single-flight, debounced runner the controller's loops and the agent's rescans run their
// passes through (docs/runtime.md): a burst is one pass, an ask during a pass is one more after it,
// a sooner ask pulls an armed pass forward and a later one never pushes it back, a pass that cannot
// start waits for the next ask, and nothing starts after Stop.
#include "runtime/pass_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/loop.h"
#include "runtime/pass_loop.h"
#include "runtime/worker.h"
#include "runtime/worker_pool.h"

namespace cozy::runtime {
namespace {

using namespace std::chrono_literals;

// A loop that ends itself after 10 s (a test that hangs fails instead), the scheduler under
// test on it, and a timer that ends the run once what would happen has had time to show.
struct Fixture {
  Loop loop;
  Timer watchdog = loop.AddTimer("watchdog", [this] { loop.Exit(99); });
  Timer end = loop.AddTimer("end", [this] { loop.Exit(0); });
  std::unique_ptr<PassScheduler> scheduler;
  Fixture() { watchdog.Arm(10s); }
  PassScheduler& Schedule(std::function<bool()> start) {
    scheduler = std::make_unique<PassScheduler>(loop, "pass", std::move(start));
    return *scheduler;
  }
  void EndAfter(std::chrono::milliseconds after) { end.Arm(after); }
};

TEST(PassScheduler, ABurstOfAsksIsOnePass) {
  Fixture f;
  int passes = 0;
  PassScheduler& scheduler = f.Schedule([&] {
    ++passes;
    f.loop.Post([&] { f.scheduler->Finished(); });
    return true;
  });
  for (int i = 0; i < 100; ++i) scheduler.Ask(30ms);
  EXPECT_TRUE(scheduler.Armed());
  f.EndAfter(300ms);
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_EQ(passes, 1);
}

TEST(PassScheduler, AnAskDuringAPassRunsExactlyOneMoreAfterIt) {
  Fixture f;
  Worker worker("passes");
  std::vector<std::string> events;
  std::atomic<bool> released{false};  // the first pass runs until the asks below were made
  Timer settle = f.loop.AddTimer("settle", [&] { f.loop.Exit(0); });
  PassScheduler& scheduler = f.Schedule([&] {
    events.push_back("start");
    worker.Run([&] {
      while (!released) std::this_thread::sleep_for(1ms);
      f.loop.Post([&] {
        events.push_back("end");
        f.scheduler->Finished();
        if (events.size() == 4) settle.Arm(200ms);  // what would run past it shows meanwhile
      });
    });
    return true;
  });
  scheduler.Ask(0ms);
  // While the first pass runs: three asks, one more pass.
  Timer during = f.loop.AddTimer("during", [&] {
    EXPECT_TRUE(scheduler.Running());
    scheduler.Ask(20ms);
    scheduler.Ask(0ms);
    scheduler.Ask(40ms);
    EXPECT_FALSE(scheduler.Armed()) << "nothing starts while a pass runs";
    released = true;
  });
  during.Arm(20ms);
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_EQ(events, (std::vector<std::string>{"start", "end", "start", "end"}));
}

TEST(PassScheduler, ASoonerAskPullsThePassForwardALaterOneNeverPushesItBack) {
  Fixture f;
  int passes = 0;
  PassScheduler& scheduler = f.Schedule([&] {
    ++passes;
    f.scheduler->Finished();
    f.loop.Exit(0);
    return true;
  });
  scheduler.Ask(60s);
  scheduler.Ask(10ms);  // pulls it forward: the run ends well before the watchdog
  scheduler.Ask(30s);   // never pushes it back
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_EQ(passes, 1);
}

TEST(PassScheduler, APassThatCannotStartWaitsForTheNextAsk) {
  Fixture f;
  bool runnable = false;
  int tries = 0;
  int passes = 0;
  PassScheduler& scheduler = f.Schedule([&] {
    ++tries;
    if (!runnable) return false;
    ++passes;
    f.scheduler->Finished();
    return true;
  });
  scheduler.Ask(0ms);
  Timer later = f.loop.AddTimer("later", [&] {
    EXPECT_EQ(tries, 1);
    EXPECT_FALSE(scheduler.Running()) << "a pass that did not start is not running";
    EXPECT_FALSE(scheduler.Armed()) << "nothing retries by itself";
    runnable = true;
    scheduler.Ask(0ms);
  });
  later.Arm(100ms);
  f.EndAfter(300ms);
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_EQ(tries, 2);
  EXPECT_EQ(passes, 1);
}

// A failed pass holds the next one off: a debounced ask (the binder's full pass on any cache
// change) waits out the hold, an ask for now (a bind request a VM start waits on) does not.
TEST(PassScheduler, AFailedPassHoldsOffEveryAskButOneForNow) {
  Fixture f;
  std::vector<std::string> passes;
  std::string kind = "failing";
  PassScheduler& scheduler = f.Schedule([&] {
    passes.push_back(kind);
    if (kind == "failing") {
      f.loop.Post([&] { f.scheduler->Finished(60s); });
    } else {
      f.scheduler->Finished();
      f.loop.Exit(0);
    }
    return true;
  });
  scheduler.Ask(0ms);
  Timer debounced = f.loop.AddTimer("debounced", [&] {
    EXPECT_EQ(passes.size(), 1U);
    EXPECT_TRUE(scheduler.Armed()) << "the retry";
    kind = "debounced";
    scheduler.Ask(10ms);  // held off: this alone would wait the minute out
  });
  debounced.Arm(100ms);
  Timer now = f.loop.AddTimer("now", [&] {
    EXPECT_EQ(passes.size(), 1U) << "a debounced ask ran inside the hold-off";
    kind = "now";
    scheduler.Ask(0ms);
  });
  now.Arm(400ms);
  EXPECT_EQ(f.loop.Run(), 0) << "the ask for now waited out the hold-off too";
  EXPECT_EQ(passes, (std::vector<std::string>{"failing", "now"}));
}

// A pass that goes through ends the hold-off of the failed one before it: after an ask for now
// is answered, a debounced ask (a pod change the agent reads kubelet for) waits only its debounce.
TEST(PassScheduler, APassThatGoesThroughEndsTheHoldOff) {
  Fixture f;
  std::vector<std::string> passes;
  std::string kind = "failing";
  PassScheduler& scheduler = f.Schedule([&] {
    passes.push_back(kind);
    if (kind == "failing") {
      f.loop.Post([&] { f.scheduler->Finished(60s); });
    } else if (kind == "now") {
      f.loop.Post([&] {
        f.scheduler->Finished();
        kind = "debounced";
        f.scheduler->Ask(10ms);
      });
    } else {
      f.scheduler->Finished();
      f.loop.Exit(0);
    }
    return true;
  });
  scheduler.Ask(0ms);
  Timer now = f.loop.AddTimer("now", [&] {
    kind = "now";
    scheduler.Ask(0ms);
  });
  now.Arm(100ms);
  EXPECT_EQ(f.loop.Run(), 0) << "the debounced ask waited out the hold-off of the failed pass";
  EXPECT_EQ(passes, (std::vector<std::string>{"failing", "now", "debounced"}));
}

// A pass that runs on the loop thread inside `start` (the agent's rescans) is over when start
// returns false: nothing is left running, a burst of asks is still one pass, and a later ask
// runs another.
TEST(PassScheduler, APassRunInlineIsOverWhenStartReturns) {
  Fixture f;
  int passes = 0;
  PassScheduler& scheduler = f.Schedule([&] {
    ++passes;
    return false;
  });
  for (int i = 0; i < 10; ++i) scheduler.Ask(20ms);
  Timer later = f.loop.AddTimer("later", [&] {
    EXPECT_EQ(passes, 1);
    EXPECT_FALSE(scheduler.Running());
    scheduler.Ask(10ms);
    scheduler.Ask(30ms);
  });
  later.Arm(100ms);
  f.EndAfter(300ms);
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_EQ(passes, 2);
}

TEST(PassScheduler, NothingStartsAfterStop) {
  Fixture f;
  int passes = 0;
  PassScheduler& scheduler = f.Schedule([&] {
    ++passes;
    f.loop.Post([&] { f.scheduler->Finished(); });
    return true;
  });
  scheduler.Ask(20ms);
  scheduler.Stop();
  scheduler.Ask(0ms);
  EXPECT_FALSE(scheduler.Armed());
  f.EndAfter(150ms);
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_EQ(passes, 0);
}

// PassLoop, the one loop type the controller's passes run on: a pass runs on the loop's worker,
// not the loop thread, and its result comes back to the loop thread, whose Done ends it; a due
// pass its owner gives none for runs nothing; Stop waits for the pass in flight; and after it no
// pass starts whatever is asked.
TEST(PassLoop, APassRunsOnTheWorkerItsResultComesBackAndNothingRunsAfterStop) {
  Fixture f;
  const std::thread::id loopThread = std::this_thread::get_id();
  bool ready = false;
  std::atomic<int> ran{0};
  std::atomic<bool> onWorker{false};
  std::atomic<bool> inFlightAtStop{false};
  std::vector<int> results;
  std::unique_ptr<PassLoop<int>> passes;
  passes = std::make_unique<PassLoop<int>>(
      f.loop, "pass", "pass-worker",
      [&]() -> std::function<int()> {
        EXPECT_EQ(std::this_thread::get_id(), loopThread);
        if (!ready) return {};
        return [&] {
          onWorker = std::this_thread::get_id() != loopThread;
          const int pass = ++ran;
          if (pass == 2) {
            // Stop comes while this pass runs, and waits for it.
            f.loop.Post([&] {
              inFlightAtStop = true;
              passes->Stop();
              inFlightAtStop = false;
            });
            std::this_thread::sleep_for(50ms);
            EXPECT_TRUE(inFlightAtStop.load()) << "Stop returned before the pass in flight ended";
          }
          return pass;
        };
      },
      [&](int result) {
        EXPECT_EQ(std::this_thread::get_id(), loopThread);
        results.push_back(result);
        passes->Finished();
        if (result == 1) passes->Ask(0ms);  // the second
      });
  passes->Ask(0ms);  // before Start: nothing
  passes->Start();
  passes->Ask(0ms);  // due, but the owner gives no pass
  Timer open = f.loop.AddTimer("open", [&] {
    ready = true;
    passes->Ask(0ms);
  });
  open.Arm(50ms);
  Timer late = f.loop.AddTimer("late", [&] { passes->Ask(0ms); });  // after Stop: nothing
  late.Arm(300ms);
  f.EndAfter(500ms);
  EXPECT_EQ(f.loop.Run(), 0);
  EXPECT_TRUE(onWorker);
  EXPECT_TRUE(passes->Stopping());
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(results, (std::vector<int>{1, 2}));
}

// The pool the binder's placement writes go through: threads start only as jobs find none idle,
// up to its capacity, and stay for the next burst; WaitUntil wakes as jobs end; WaitIdle returns
// only once every job handed over has ended; the destructor finishes what was handed over.
TEST(WorkerPool, GrowsToItsCapacityAsNeededKeepsItsThreadsAndDrains) {
  std::atomic<int> done{0};
  {
    WorkerPool pool("pool-test", 3);
    EXPECT_EQ(pool.Threads(), 0U);
    std::atomic<bool> release{false};
    for (int i = 0; i < 6; ++i) {
      pool.Submit([&] {
        while (!release.load()) std::this_thread::sleep_for(1ms);
        ++done;
      });
    }
    EXPECT_EQ(pool.Threads(), 3U) << "no more than its capacity";
    release = true;
    pool.WaitUntil([&] { return done.load() >= 2; });
    EXPECT_GE(done.load(), 2);
    pool.WaitIdle();
    EXPECT_EQ(done.load(), 6);
    // The next burst runs on the same threads.
    for (int i = 0; i < 6; ++i) pool.Submit([&] { ++done; });
    pool.WaitIdle();
    EXPECT_EQ(done.load(), 12);
    EXPECT_EQ(pool.Threads(), 3U);
    for (int i = 0; i < 4; ++i) {
      pool.Submit([&] {
        std::this_thread::sleep_for(20ms);
        ++done;
      });
    }
  }  // the destructor lets them end
  EXPECT_EQ(done.load(), 16);
}

// Two jobs handed over at once find two threads, though one thread was idle: the informer
// loop's lists of two caches run side by side.
TEST(WorkerPool, JobsHandedOverTogetherRunTogether) {
  WorkerPool pool("pool-test", 4);
  pool.Submit([] {});
  pool.WaitIdle();
  ASSERT_EQ(pool.Threads(), 1U);
  std::atomic<int> started{0};
  std::atomic<int> sawBoth{0};
  const auto meet = [&] {
    ++started;
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    if (started.load() >= 2) ++sawBoth;
  };
  pool.Submit(meet);
  pool.Submit(meet);
  pool.WaitIdle();
  EXPECT_EQ(sawBoth.load(), 2) << "the second job waited for the first";
  EXPECT_EQ(pool.Threads(), 2U);
}

// The HTTP server's pool: every thread started up front, a bounded queue that TrySubmit reports
// full (the server answers 503 "busy"), and Stop, which drops what waits and lets what runs end.
TEST(WorkerPool, ABoundedQueueRefusesWhenFullAndStopDropsWhatWaits) {
  WorkerPool pool("pool-test", 1, 2);
  pool.StartAll();
  EXPECT_EQ(pool.Threads(), 1U);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.TrySubmit([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
    ++ran;
  }));
  for (int i = 0; i < 2000 && pool.Running() == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(pool.Running(), 1U);
  EXPECT_TRUE(pool.TrySubmit([&] { ++ran; }));
  EXPECT_TRUE(pool.TrySubmit([&] { ++ran; }));
  EXPECT_EQ(pool.Queued(), 2U);
  EXPECT_FALSE(pool.TrySubmit([&] { ++ran; })) << "a third job waited in a queue of two";
  EXPECT_EQ(pool.Threads(), 1U);
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);
    release = true;
  });
  pool.Stop();
  releaser.join();
  EXPECT_EQ(ran.load(), 1) << "the running job ends, the waiting ones are dropped";
  EXPECT_FALSE(pool.TrySubmit([&] { ++ran; }));
  EXPECT_EQ(pool.Queued(), 0U);
}

}  // namespace
}  // namespace cozy::runtime
