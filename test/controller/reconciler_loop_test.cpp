// The reconciler loop's debounce (issue 26 §1): 50 ms on a cluster whose passes are quick, four
// times the last pass's time where that is longer, and never past a second, so a storm of
// changes on a large cluster leaves the binder most of the cores.
#include <gtest/gtest.h>

#include <chrono>

#include "controller/reconciler/loop.h"

namespace cozy::controller {
namespace {

using std::chrono::milliseconds;

TEST(ReconcilerLoopIssue26, DebounceIsFourTimesTheLastPassBetweenFiftyMillisecondsAndASecond) {
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
