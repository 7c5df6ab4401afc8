// The binder loop's QuietRoom (docs/controller.md, "Who wakes for a change"): what the pods cache's
// filter gets from it while a pass runs and after. A pass records the pod changes that come while
// it runs; one that decided only held keeps replays them against the room it left, and passes again
// only when the room does not take one.
#include <gtest/gtest.h>

#include <string>

#include "controller/binder/loop.h"
#include "test/controller/model_fixtures.h"

namespace cozy::controller {
namespace {

using model::FreeUnits;
using model::Pod;
using model::testing::kA100;
using model::testing::MakePod;
using Take = QuietRoom::Take;

// Node n1 with `free` units of the A100 resource left, n2 with two.
FreeUnits Room(int64_t free) {
  FreeUnits room;
  room.resources = {kA100};
  room.byNode["n1"][kA100] = free;
  room.byNode["n2"][kA100] = 2;
  return room;
}

TEST(QuietRoomLoop, ChangesDuringAPassAreRecordedAndTakenWhenItSettles) {
  QuietRoom room;
  const Pod first = MakePod("t", "a", "n1", kA100, 1);
  const Pod second = MakePod("t", "b", "n2", kA100, 1);
  // Unsettled and no pass running: a change needs a pass.
  EXPECT_EQ(room.Absorbs(nullptr, &first), Take::kRefused);

  room.BeginPass();
  EXPECT_EQ(room.Absorbs(nullptr, &first), Take::kRecorded);
  EXPECT_EQ(room.Absorbs(nullptr, &second), Take::kRecorded);
  EXPECT_FALSE(room.Settled());
  EXPECT_EQ(room.Absorbed(), 0);
  // Both fit the room the pass left: settled, no pass again, and the room is what is left.
  EXPECT_FALSE(room.Settle(Room(1)));
  EXPECT_TRUE(room.Settled());
  EXPECT_EQ(room.Absorbed(), 2);
  const Pod third = MakePod("t", "c", "n1", kA100, 1);
  EXPECT_EQ(room.Absorbs(nullptr, &third), Take::kRefused) << "n1's unit went to the first";
  EXPECT_FALSE(room.Settled()) << "a change turned down unsettles the room";
}

TEST(QuietRoomLoop, ARecordedChangeTheRoomRefusesMeansAnotherPassAndNoRoom) {
  QuietRoom room;
  const Pod first = MakePod("t", "a", "n1", kA100, 1);
  const Pod second = MakePod("t", "b", "n1", kA100, 1);
  room.BeginPass();
  EXPECT_EQ(room.Absorbs(nullptr, &first), Take::kRecorded);
  EXPECT_EQ(room.Absorbs(nullptr, &second), Take::kRecorded);
  EXPECT_TRUE(room.Settle(Room(1))) << "the second overfills n1";
  EXPECT_FALSE(room.Settled());
  EXPECT_EQ(room.Absorbed(), 0);
  EXPECT_EQ(room.Absorbs(nullptr, &first), Take::kRefused);

  // A pod that frees units, recorded during a pass, never gives them back to the room: the
  // pass may have counted it already.
  room.BeginPass();
  EXPECT_EQ(room.Absorbs(&first, nullptr), Take::kRecorded);
  EXPECT_EQ(room.Absorbs(nullptr, &second), Take::kRecorded);
  EXPECT_TRUE(room.Settle(Room(0)));
  EXPECT_FALSE(room.Settled());
}

TEST(QuietRoomLoop, APassThatSettlesNothingPassesAgainOnlyForWhatItRecorded) {
  QuietRoom room;
  const Pod pod = MakePod("t", "a", "n1", kA100, 1);
  room.BeginPass();
  EXPECT_FALSE(room.EndPass()) << "nothing came during the pass";
  room.BeginPass();
  EXPECT_EQ(room.Absorbs(nullptr, &pod), Take::kRecorded);
  EXPECT_TRUE(room.EndPass());
  EXPECT_FALSE(room.Settled());
  EXPECT_EQ(room.Absorbs(nullptr, &pod), Take::kRefused) << "no pass records after EndPass";
}

TEST(QuietRoomLoop, AnUnsettleDuringAPassKeepsItFromSettlingAndPassesAgain) {
  QuietRoom room;
  const Pod pod = MakePod("t", "a", "n1", kA100, 1);
  // Taking the lead in the middle of a pass: its room is nobody's now.
  room.BeginPass();
  EXPECT_EQ(room.Absorbs(nullptr, &pod), Take::kRecorded);
  room.Unsettle();
  EXPECT_EQ(room.Absorbs(nullptr, &pod), Take::kRefused);
  EXPECT_TRUE(room.Settle(Room(1)));
  EXPECT_FALSE(room.Settled());
  room.BeginPass();
  room.Unsettle();
  EXPECT_TRUE(room.EndPass());
}

TEST(QuietRoomLoop, PastTheRecordLimitThePassRunsAgain) {
  QuietRoom room;
  const Pod pod = MakePod("t", "a", "n1", kA100, 0);  // holds nothing: the room takes it
  room.BeginPass();
  for (size_t i = 0; i < QuietRoom::kRecordLimit; ++i) {
    ASSERT_EQ(room.Absorbs(nullptr, &pod), Take::kRecorded);
  }
  EXPECT_FALSE(room.Settle(Room(1))) << "as many as the limit are replayed";
  EXPECT_EQ(room.Absorbed(), static_cast<int64_t>(QuietRoom::kRecordLimit));
  room.BeginPass();
  for (size_t i = 0; i <= QuietRoom::kRecordLimit; ++i) {
    ASSERT_EQ(room.Absorbs(nullptr, &pod), Take::kRecorded);
  }
  EXPECT_TRUE(room.Settle(Room(1))) << "one past it is a pass";
  EXPECT_FALSE(room.Settled());
}

}  // namespace
}  // namespace cozy::controller
