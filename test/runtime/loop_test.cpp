// The runtime's loop: owned sources, callbacks that throw, sources released from inside their own
// callbacks, work posted from other threads, and the worker thread.
#include "runtime/loop.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/duration_flag.h"
#include "runtime/log.h"
#include "runtime/worker.h"

namespace cozy::runtime {
namespace {

using namespace std::chrono_literals;

class LoopTest : public ::testing::Test {
 protected:
  void SetUp() override { Logger::Get().SetSinkForTesting(&lines_); }
  void TearDown() override { Logger::Get().SetSinkForTesting(nullptr); }
  bool Logged(const std::string& text) const {
    for (const auto& line : lines_) {
      if (line.find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  }
  std::vector<std::string> lines_;
};

// A callback that throws is logged with its source's name and the loop goes on: before the
// runtime, an exception through sd-event's C frames terminated the agent.
TEST_F(LoopTest, ACallbackThatThrowsIsLoggedAndTheLoopGoesOn) {
  Loop loop;
  int later = 0;
  Timer bad = loop.AddTimer("bad timer", [] { throw std::runtime_error("items is not an array"); });
  Timer good = loop.AddTimer("good timer", [&] {
    ++later;
    loop.Exit(7);
  });
  bad.Arm(1ms);
  good.Arm(20ms);
  EXPECT_EQ(loop.Run(), 7);
  EXPECT_EQ(later, 1);
  EXPECT_EQ(loop.callbackFailures(), 1);
  EXPECT_TRUE(Logged("bad timer")) << ::testing::PrintToString(lines_);
  EXPECT_TRUE(Logged("items is not an array"));
}

// A source released from inside its own callback (a D-Bus connection dropped while handling its
// socket) is freed after the callback returns and never fires again.
TEST_F(LoopTest, ASourceResetInsideItsOwnCallbackIsSafe) {
  Loop loop;
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  int fired = 0;
  Io io;
  io = loop.AddIo("pipe", pipeFds[0], EPOLLIN, [&](uint32_t) {
    ++fired;
    io = Io();  // replaces (and releases) the source whose callback this is
  });
  ASSERT_EQ(::write(pipeFds[1], "x", 1), 1);
  Timer stop = loop.AddTimer("stop", [&] { loop.Exit(0); });
  stop.Arm(100ms);
  EXPECT_EQ(loop.Run(), 0);
  EXPECT_EQ(fired, 1);  // the byte is still unread: a live source would have fired again
  ::close(pipeFds[0]);
  ::close(pipeFds[1]);
}

TEST_F(LoopTest, TimersReArmAndCancel) {
  Loop loop;
  int ticks = 0;
  Timer cancelled = loop.AddTimer("cancelled", [&] { ADD_FAILURE() << "a cancelled timer fired"; });
  cancelled.Arm(5ms);
  cancelled.Cancel();
  EXPECT_FALSE(cancelled.Armed());
  Timer tick;
  tick = loop.AddTimer("tick", [&] {
    if (++ticks == 3) {
      loop.Exit(0);
    } else {
      tick.Arm(1ms);
    }
  });
  tick.Arm(1ms);
  EXPECT_TRUE(tick.Armed());
  loop.Run();
  EXPECT_EQ(ticks, 3);
}

TEST_F(LoopTest, WorkPostedFromOtherThreadsRunsOnTheLoopInOrder) {
  Loop loop;
  std::vector<int> seen;
  const auto loopThread = std::this_thread::get_id();
  std::atomic<bool> allOnLoop{true};
  std::thread poster([&] {
    for (int i = 0; i < 100; ++i) {
      loop.Post([&, i] {
        allOnLoop = allOnLoop && std::this_thread::get_id() == loopThread;
        seen.push_back(i);
      });
    }
    loop.Post([] { throw std::runtime_error("posted work failed"); });
    loop.RequestExit(3);
  });
  EXPECT_EQ(loop.Run(), 3);
  poster.join();
  ASSERT_EQ(seen.size(), 100U);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  }
  EXPECT_TRUE(allOnLoop);
  EXPECT_TRUE(Logged("posted work failed"));
}

TEST_F(LoopTest, AWorkerRunsJobsInOrderOffTheLoopAndSurvivesAThrow) {
  Loop loop;
  Worker worker("test");
  std::vector<int> results;
  worker.Run([] { throw std::runtime_error("job failed"); });
  for (int i = 0; i < 5; ++i) {
    worker.Run([&loop, &results, i] {
      std::this_thread::sleep_for(5ms);  // a blocking call: the loop meanwhile turns
      loop.Post([&results, i] { results.push_back(i); });
    });
  }
  int ticks = 0;
  Timer tick;
  tick = loop.AddTimer("tick", [&] {
    ++ticks;
    if (results.size() == 5) {
      loop.Exit(0);
    } else {
      tick.Arm(1ms);
    }
  });
  tick.Arm(1ms);
  loop.Run();
  EXPECT_EQ(results, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_GT(ticks, 1);  // the loop ran while the jobs blocked
  EXPECT_TRUE(Logged("job failed"));
}

TEST_F(LoopTest, AChildIsReapedWithItsExitCode) {
  Loop loop;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, nullptr);  // before fork: no SIGCHLD lost to a default handler
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::_exit(3);
  }
  int status = -1;
  Child child = loop.AddChild("child", pid, [&](int code) {
    status = code;
    loop.Exit(0);
  });
  Timer limit = loop.AddTimer("limit", [&] { loop.Exit(1); });
  limit.Arm(5s);
  EXPECT_EQ(loop.Run(), 0);
  EXPECT_EQ(status, 3);
}

TEST(Duration, FormatsInTheLargestExactUnitAndReadsBack) {
  EXPECT_EQ(FormatDuration(2min), "2m");
  EXPECT_EQ(FormatDuration(15s), "15s");
  EXPECT_EQ(FormatDuration(500ms), "500ms");
  EXPECT_EQ(FormatDuration(90s), "90s");
  EXPECT_EQ(FormatDuration(1h), "1h");
  EXPECT_EQ(FormatDuration(0ms), "0s");
  for (const std::chrono::milliseconds value :
       std::vector<std::chrono::milliseconds>{0ms, 1ms, 1500ms, 61s, 5min, 2h}) {
    EXPECT_EQ(ParseDuration(FormatDuration(value)), value);
  }
}

// A flag bound to its option: the option's value is the default --help shows, a given value
// lands in it converted, and one outside the rule is a parse error naming the flag.
TEST(DurationFlag, BindsIntoItsOptionAndRefusesWhatItsRuleForbids) {
  struct Options {
    std::chrono::milliseconds grace = 2min;
    std::chrono::nanoseconds lease = 15s;
    std::chrono::milliseconds wait = 5min;
  };
  auto parse = [](Options& options, std::vector<std::string> args) {
    CLI::App app;
    AddDurationFlag(&app, "--grace", options.grace, "");
    AddDurationFlag(&app, "--lease", options.lease, "");
    AddDurationFlag(&app, "--wait", options.wait, "", DurationRule::kNonNegative);
    std::reverse(args.begin(), args.end());
    try {
      app.parse(args);
      return std::string();
    } catch (const CLI::ParseError& error) {
      return std::string(error.what());
    }
  };
  {
    CLI::App app;
    Options options;
    AddDurationFlag(&app, "--grace", options.grace, "");
    EXPECT_NE(app.help().find("--grace DURATION=2m"), std::string::npos) << app.help();
  }
  Options options;
  EXPECT_EQ(parse(options, {}), "");
  EXPECT_EQ(options.grace, 2min);  // untouched without the flag
  EXPECT_EQ(parse(options, {"--grace", "90s", "--lease=500ms", "--wait", "0s"}), "");
  EXPECT_EQ(options.grace, 90s);
  EXPECT_EQ(options.lease, 500ms);
  EXPECT_EQ(options.wait, 0ms);
  for (const char* bad : {"0s", "-1s", "soon"}) {
    const std::string error = parse(options, {"--grace", bad});
    EXPECT_NE(error.find("--grace"), std::string::npos) << error;
    EXPECT_NE(error.find("positive"), std::string::npos) << error;
  }
  EXPECT_NE(parse(options, {"--wait", "-1s"}).find("--wait"), std::string::npos);
  EXPECT_EQ(options.grace, 90s);  // a refused value changes nothing
}

TEST(Duration, ParsesTheUnitsFlagsUse) {
  EXPECT_EQ(ParseDuration("5s"), 5000ms);
  EXPECT_EQ(ParseDuration("300ms"), 300ms);
  EXPECT_EQ(ParseDuration("10m"), 600000ms);
  EXPECT_EQ(ParseDuration("1h"), 3600000ms);
  EXPECT_EQ(ParseDuration("7"), 7000ms);
  EXPECT_FALSE(ParseDuration("-1s"));
  EXPECT_FALSE(ParseDuration("5 s"));
  EXPECT_FALSE(ParseDuration("5d"));
  EXPECT_FALSE(ParseDuration(""));
  EXPECT_FALSE(ParseDuration("99999999999999999h"));
}

}  // namespace
}  // namespace cozy::runtime
