// The scanner's file access: directories opened below one another, listings read with
// getdents64, and the statuses a scan turns into problems.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "sysfs/sysfs_io.h"
#include "test/support/fixture_host.h"

namespace cozy::sysfs {
namespace {

namespace fs = std::filesystem;
using cozy::testing::TempDir;

void Write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// A directory opened below another is walked from it: reads, links and listings through it are
// those of the real directory, and messages call it by the path it was given.
TEST(Directory, OpenedBelowAnotherReadsWhatIsThere) {
  const TempDir root;
  fs::create_directories(root.path() / "devices/pci0000:3a/0000:3b:00.0/mdev_supported_types/t1");
  const fs::path function = root.path() / "devices/pci0000:3a/0000:3b:00.0";
  Write(function / "uevent", "PCI_ID=10DE:20F1\n");
  Write(function / "mdev_supported_types/t1/available_instances", "3\n");
  fs::create_symlink("../../../kernel/iommu_groups/40", function / "iommu_group");

  const Directory devices((root.path() / "devices").string());
  ASSERT_TRUE(devices.ok());
  Directory below(devices, "pci0000:3a/0000:3b:00.0", "sys/devices/x");
  ASSERT_TRUE(below.ok());
  EXPECT_EQ(below.path(), "sys/devices/x");
  EXPECT_EQ(below.Read("uevent").text, "PCI_ID=10DE:20F1\n");
  EXPECT_EQ(below.ReadLink("iommu_group").target, "../../../kernel/iommu_groups/40");

  const Directory types(below, "mdev_supported_types/", {}, Directory::Mode::kListable);
  ASSERT_TRUE(types.ok());
  const DirectoryListing listing = types.ListEntries();
  ASSERT_EQ(listing.status, IoStatus::kOk);
  EXPECT_EQ(listing.names, std::vector<std::string>{"t1"});
  EXPECT_EQ(types.Read("t1/available_instances").text, "3\n");

  // Moved, the handle still reads; the moved-from one is closed.
  const Directory moved(std::move(below));
  EXPECT_EQ(moved.Read("uevent").status, IoStatus::kOk);
  EXPECT_FALSE(below.ok());  // NOLINT(bugprone-use-after-move): closed, not shared
}

// What is not there is missing (a scan skips it quietly); a file where a directory should be is
// missing too (ENOTDIR), as a vanished function is; below a missing directory nothing opens.
TEST(Directory, MissingNotADirectoryAndBelowAMissingOne) {
  const TempDir root;
  Write(root.path() / "file", "x\n");
  const Directory top(root.path().string());
  const Directory gone(top, "gone", "gone");
  EXPECT_FALSE(gone.ok());
  EXPECT_EQ(gone.status(), IoStatus::kMissing);
  const Directory file(top, "file", "file", Directory::Mode::kListable);
  EXPECT_EQ(file.status(), IoStatus::kMissing);
  EXPECT_EQ(file.ListEntries().status, IoStatus::kMissing);
  const Directory belowGone(gone, "any", "gone/any");
  EXPECT_EQ(belowGone.status(), IoStatus::kMissing);
  EXPECT_EQ(Directory(top, "gone", "gone", Directory::Mode::kListable).ListEntries().status,
            IoStatus::kMissing);
  EXPECT_EQ(top.Read("gone").status, IoStatus::kMissing);
}

// A handle opened for reading entries only (O_PATH) cannot be listed: an error, never an empty
// listing that would read as "no mdev types".
TEST(Directory, APathHandleIsNotListedAsEmpty) {
  const TempDir root;
  fs::create_directory(root.path() / "d");
  Write(root.path() / "d/entry", "x\n");
  const Directory pathOnly((root.path() / "d").string());
  const DirectoryListing listing = pathOnly.ListEntries();
  EXPECT_EQ(listing.status, IoStatus::kError);
  EXPECT_FALSE(listing.error.empty());
  EXPECT_TRUE(listing.names.empty());
}

// A listing longer than one getdents64 buffer (16 KiB) is read whole, without "." entries:
// sys/bus/pci/devices of a large host and sys/bus/mdev/devices hold hundreds of entries.
TEST(Directory, ListingsLongerThanOneBufferAreWhole) {
  const TempDir root;
  std::set<std::string> made;
  for (int i = 0; i < 1500; ++i) {
    std::string name = "aaaaaaaa-0000-4000-8000-" + std::to_string(100000000000 + i);
    Write(root.path() / name, "");
    made.insert(name);
  }
  Write(root.path() / ".hidden", "");
  const Directory listable(root.path().string(), Directory::Mode::kListable);
  const DirectoryListing listing = listable.ListEntries();
  ASSERT_EQ(listing.status, IoStatus::kOk);
  EXPECT_EQ(std::set<std::string>(listing.names.begin(), listing.names.end()), made);
  EXPECT_EQ(listing.names.size(), made.size());  // each once
  // Opened below another, as the scanner opens mdev_supported_types.
  const Directory parent(root.path().parent_path().string());
  const Directory below(parent, root.path().filename().string(), "below",
                        Directory::Mode::kListable);
  EXPECT_EQ(below.ListEntries().names.size(), made.size());
}

}  // namespace
}  // namespace cozy::sysfs
