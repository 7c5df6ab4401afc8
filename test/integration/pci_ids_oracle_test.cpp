// Names by lookup (sysfs/pci_ids.h) against libpci's own parse of the same file: on Debian's
// pci.ids every vendor and device the file lists, and IDs it does not; on a hand-written file
// each corner of libpci's grammar; and the files libpci would read in place of the given path.
// The scan does not have libpci parse all of pci.ids (docs/gpu-agent.md); the names must not
// change.
#include <gtest/gtest.h>

extern "C" {
#include <pci/pci.h>
}

#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "sysfs/pci_ids.h"
#include "sysfs/scanner.h"
#include "test/support/fixture_host.h"

namespace cozy::sysfs {
namespace {

namespace fs = std::filesystem;
using cozy::testing::FixtureHost;
using cozy::testing::TempDir;

constexpr const char* kDebianPciIds = "/usr/share/misc/pci.ids";

// libpci's callbacks: its errors (a file it refuses) end the test binary, as libpci's default.
extern "C" __attribute__((noreturn, format(printf, 1, 2))) void OnError(char* format, ...) {
  va_list arguments;
  va_start(arguments, format);
  std::vfprintf(stderr, format, arguments);
  va_end(arguments);
  std::abort();
}
extern "C" void OnMessage(char* /*format*/, ...) {}

// libpci's lookup, as the scan asked it before: names only, no hwdb, no numbers.
class LibpciNames {
 public:
  explicit LibpciNames(std::string path) : path_(std::move(path)), access_(pci_alloc()) {
    access_->error = OnError;
    access_->warning = OnMessage;
    access_->debug = OnMessage;
    pci_set_param(access_, const_cast<char*>("hwdb.disable"), const_cast<char*>("1"));
    pci_set_name_list_path(access_, path_.data(), 0);  // libpci keeps the pointer
  }
  ~LibpciNames() { pci_cleanup(access_); }
  LibpciNames(const LibpciNames&) = delete;
  LibpciNames& operator=(const LibpciNames&) = delete;

  std::string Vendor(uint16_t vendor) { return Lookup(PCI_LOOKUP_VENDOR, vendor, 0); }
  std::string Device(uint16_t vendor, uint16_t device) {
    return Lookup(PCI_LOOKUP_DEVICE, vendor, device);
  }

 private:
  std::string Lookup(int kind, unsigned vendor, unsigned device) {
    std::array<char, 1024> buffer{};
    const char* name =
        pci_lookup_name(access_, buffer.data(), static_cast<int>(buffer.size()),
                        kind | PCI_LOOKUP_NO_NUMBERS | PCI_LOOKUP_NO_HWDB, vendor, device);
    return name == nullptr ? std::string() : std::string(name);
  }
  std::string path_;
  pci_access* access_;
};

void Write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Every vendor line's and device line's IDs, read crudely: only to choose what to ask both.
std::pair<std::set<uint16_t>, std::set<std::pair<uint16_t, uint16_t>>> ListedIds(
    const std::string& path) {
  std::ifstream in(path);
  std::set<uint16_t> vendors;
  std::set<std::pair<uint16_t, uint16_t>> devices;
  const std::regex vendorLine(R"(^([0-9a-fA-F]{4})\s)");
  const std::regex deviceLine(R"(^\t([0-9a-fA-F]{4})\s)");
  std::string line;
  std::optional<uint16_t> vendor;
  std::smatch match;
  while (std::getline(in, line)) {
    if (std::regex_search(line, match, vendorLine)) {
      vendor = static_cast<uint16_t>(std::stoul(match[1], nullptr, 16));
      vendors.insert(*vendor);
    } else if (!line.empty() && line[0] != '\t' && line[0] != '#') {
      vendor.reset();  // a class or other block
    } else if (vendor && std::regex_search(line, match, deviceLine)) {
      devices.emplace(*vendor, static_cast<uint16_t>(std::stoul(match[1], nullptr, 16)));
    }
  }
  return {vendors, devices};
}

TEST(PciIdsOracle, NamesEveryVendorAndDeviceOfDebiansFileAsLibpciDoes) {
  ASSERT_TRUE(fs::exists(kDebianPciIds)) << kDebianPciIds << " (Debian's pci.ids) is missing";
  const auto [vendors, devices] = ListedIds(kDebianPciIds);
  ASSERT_GT(vendors.size(), 1000U);
  ASSERT_GT(devices.size(), 10000U);
  LibpciNames libpci(kDebianPciIds);
  PciIdsFile file(kDebianPciIds);
  ASSERT_TRUE(file.usable());
  size_t named = 0;
  for (uint32_t vendor = 0; vendor <= 0xffff; ++vendor) {
    const auto id = static_cast<uint16_t>(vendor);
    const std::string expected = libpci.Vendor(id);
    ASSERT_EQ(file.VendorName(id), expected) << "vendor " << std::hex << vendor;
    named += expected.empty() ? 0U : 1U;
  }
  EXPECT_EQ(named, vendors.size());  // every listed vendor named, nothing else
  for (const auto& [vendor, device] : devices) {
    const std::string expected = libpci.Device(vendor, device);
    ASSERT_FALSE(expected.empty()) << std::hex << vendor << ":" << device;
    ASSERT_EQ(file.DeviceName(vendor, device), expected) << std::hex << vendor << ":" << device;
  }
  // IDs the file does not list: of listed vendors, of unlisted ones, and asked twice (cached).
  std::mt19937 random(26);
  std::uniform_int_distribution<uint32_t> any(0, 0xffff);
  for (int i = 0; i < 20000; ++i) {
    const auto vendor = static_cast<uint16_t>(any(random));
    const auto device = static_cast<uint16_t>(any(random));
    const std::string expected = libpci.Device(vendor, device);
    ASSERT_EQ(file.DeviceName(vendor, device), expected) << std::hex << vendor << ":" << device;
    ASSERT_EQ(file.DeviceName(vendor, device), expected) << std::hex << vendor << ":" << device;
  }
}

// Each rule of libpci's grammar that decides a name.
TEST(PciIdsOracle, FollowsLibpciOnEachCornerOfTheGrammar) {
  const TempDir directory;
  const fs::path path = directory.path() / "pci.ids";
  Write(path,
        "# a comment\n"
        "   # an indented comment\n"
        "\n"
        "1234  Plain Vendor\n"
        "\t0001  First device\n"
        "\t\t1234 0001  a subsystem, not a device\n"
        "# a comment inside the block does not end it\n"
        "\t0002  Second device\t\n"        // one trailing tab goes
        "\t0003  Two trailing blanks  \n"  // only one goes
        "\t0004\tTab after the ID\n"       //
        "\t00aB  Mixed-case hex\n"         //
        "\t0005  Carriage return\r\n"      //
        "\t0006  Cut at a carriage return\rrest\n"
        "\t0001  A duplicate is not read\n"  // libpci would refuse the file: see below
        "ABCD  Capital hex vendor\n"
        "\tfFfF  Capital hex device\n"
        "5678  Vendor without devices\n"
        "C 03  Display controller\n"
        "\t00  VGA compatible controller\n"  // a subclass, not a device of 5678
        "\t\t00  VGA controller\n"
        "S 1234\n"  // libpci: nothing may follow the ID
        "\t0001  not a device of anyone\n"
        "X 00  An unknown block\n"
        "\t0002  skipped\n"
        "9abc  Last vendor, no newline at the end\n"
        "\t0007  Last device");
  // libpci refuses a file with a duplicate entry; ask it the same file without the duplicate.
  const fs::path forLibpci = directory.path() / "pci.ids.libpci";
  {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string content = text.str();
    const std::string duplicate = "\t0001  A duplicate is not read\n";
    content.erase(content.find(duplicate), duplicate.size());
    Write(forLibpci, content);
  }
  LibpciNames libpci(forLibpci.string());
  PciIdsFile file(path.string());
  ASSERT_TRUE(file.usable());
  for (const int vendor : {0x1234, 0xabcd, 0x5678, 0x9abc, 0x0003, 0x0300, 0x0001}) {
    const auto id = static_cast<uint16_t>(vendor);
    EXPECT_EQ(file.VendorName(id), libpci.Vendor(id)) << std::hex << vendor;
  }
  EXPECT_EQ(file.VendorName(0x1234), "Plain Vendor");
  EXPECT_EQ(file.VendorName(0x5678), "Vendor without devices");
  const std::vector<std::pair<uint16_t, uint16_t>> asked = {
      {0x1234, 0x0001}, {0x1234, 0x0002}, {0x1234, 0x0003}, {0x1234, 0x0004}, {0x1234, 0x00ab},
      {0x1234, 0x0005}, {0x1234, 0x0006}, {0x1234, 0x1234}, {0xabcd, 0xffff}, {0x5678, 0x0000},
      {0x1234, 0x0000}, {0x9abc, 0x0007}, {0x0300, 0x0000}, {0x5678, 0x0001}, {0x1234, 0x0009}};
  for (const auto& [vendor, device] : asked) {
    EXPECT_EQ(file.DeviceName(vendor, device), libpci.Device(vendor, device))
        << std::hex << vendor << ":" << device;
  }
  EXPECT_EQ(file.DeviceName(0x1234, 0x0001), "First device");
  EXPECT_EQ(file.DeviceName(0x1234, 0x0002), "Second device");
  EXPECT_EQ(file.DeviceName(0x1234, 0x0003), "Two trailing blanks ");
  EXPECT_EQ(file.DeviceName(0x1234, 0x0006), "Cut at a carriage return");
  EXPECT_EQ(file.DeviceName(0x9abc, 0x0007), "Last device");
  EXPECT_EQ(file.DeviceName(0x5678, 0x0000), "");  // the class block's subclass
  EXPECT_EQ(file.DeviceName(0x1234, 0x1234), "");  // the subsystem line
}

// What a broken line does: libpci drops every name; here only that line names nothing.
TEST(PciIdsOracle, AMalformedLineNamesNothingAndTheRestStillName) {
  const TempDir directory;
  const fs::path path = directory.path() / "pci.ids";
  Write(path,
        "10de  NVIDIA Corporation\n"
        "\t233\tshort ID\n"
        "\t2330  H100 SXM5 80GB\n"
        "12  short vendor\n"
        "1002  Advanced Micro Devices, Inc. [AMD/ATI]\n"
        "\t74a1\n");
  PciIdsFile file(path.string());
  EXPECT_EQ(file.VendorName(0x10de), "NVIDIA Corporation");
  EXPECT_EQ(file.DeviceName(0x10de, 0x2330), "H100 SXM5 80GB");
  EXPECT_EQ(file.DeviceName(0x10de, 0x0233), "");
  EXPECT_EQ(file.VendorName(0x0012), "");
  EXPECT_EQ(file.VendorName(0x1002), "Advanced Micro Devices, Inc. [AMD/ATI]");
  EXPECT_EQ(file.DeviceName(0x1002, 0x74a1), "");
}

// The file the scan reads names from is libpci's: "X.gz" that is missing is read as X, and a
// compressed file is left to libpci, which decompresses it. Names come out the same each way.
TEST(PciIdsOracle, TheScanReadsTheFileLibpciWouldAndLeavesCompressedOnesToIt) {
  const TempDir directory;
  const FixtureHost host("a100-vfio");
  ScanOptions options;
  options.root = host.root().string();
  options.pciIdsPath = cozy::testing::FixturePciIds().string();
  const HostScan reference = ScanHost(options);
  const PciFunction* gpu = reference.Find(*ParsePciAddress("0000:3b:00.0"));
  ASSERT_NE(gpu, nullptr);
  ASSERT_FALSE(gpu->vendorName.empty());
  ASSERT_FALSE(gpu->deviceName.empty());

  // "pci.ids.gz" absent, "pci.ids" present: read as pci.ids.
  fs::copy_file(cozy::testing::FixturePciIds(), directory.path() / "pci.ids");
  options.pciIdsPath = (directory.path() / "pci.ids.gz").string();
  EXPECT_FALSE(PciIdsFile((directory.path() / "missing").string()).usable());
  EXPECT_TRUE(PciIdsFile(options.pciIdsPath).usable());
  const HostScan fallback = ScanHost(options);

  // A compressed file: not ours to read; libpci names from it.
  const fs::path compressedDir = directory.path() / "compressed";
  fs::create_directory(compressedDir);
  fs::copy_file(cozy::testing::FixturePciIds(), compressedDir / "pci.ids");
  const auto gzip = cozy::testing::RunCommand(
      "gzip " + cozy::testing::ShellQuote((compressedDir / "pci.ids").string()));
  ASSERT_EQ(gzip.exitCode, 0) << gzip.err;
  options.pciIdsPath = (compressedDir / "pci.ids.gz").string();
  EXPECT_FALSE(PciIdsFile(options.pciIdsPath).usable());
  const HostScan compressed = ScanHost(options);

  for (const HostScan* scan : {&fallback, &compressed}) {
    ASSERT_EQ(scan->functions.size(), reference.functions.size());
    for (size_t i = 0; i < reference.functions.size(); ++i) {
      EXPECT_EQ(scan->functions[i].vendorName, reference.functions[i].vendorName);
      EXPECT_EQ(scan->functions[i].deviceName, reference.functions[i].deviceName);
    }
  }
}

}  // namespace
}  // namespace cozy::sysfs
