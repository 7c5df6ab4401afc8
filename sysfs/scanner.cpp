#include "sysfs/scanner.h"

#include <sched.h>
#include <stdlib.h>  // mkdtemp, realpath

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "sysfs/attributes.h"
#include "sysfs/libpci_access.h"
#include "sysfs/sysfs_io.h"

namespace cozy::sysfs {
namespace {

constexpr std::string_view kBusPciDevices = "sys/bus/pci/devices";
constexpr std::string_view kBusMdevDevices = "sys/bus/mdev/devices";
constexpr std::string_view kSysDevices = "sys/devices";

// What the pass before libpci learned of one `sys/bus/pci/devices` entry.
struct Candidate {
  std::string entry;     // the entry's name
  size_t listed = 0;     // its place in the listing
  PciFunction function;  // address and sysfsPath always; the rest when `valid`
  bool valid = false;
};

// Runs work(0) .. work(count + more - 1) on `readers` threads, this one among them (0: one per
// CPU, at most 8 and one per 32 items); fewer where a thread cannot be started. This thread
// first runs `prologue`, which returns `more`: the other threads start on the first `count`
// items meanwhile, and one that runs out of them waits for the prologue to say how many follow.
// The first exception a call throws is rethrown here once all have stopped.
//
// Each started thread reads with a file descriptor table of its own (unshare(CLONE_FILES), a
// copy of the process's): a scan opens and closes thousands of files, and on a shared table
// every open and close takes the table's lock and every descriptor use a reference count. So a
// work item can use only what was open before the call (and what it opens itself, which it
// closes). The prologue runs here, on the shared table, so what it leaves open stays usable here.
template <typename Prologue, typename Work>
void ForEachInParallel(size_t count, int readers, Prologue&& prologue, Work&& work) {
  size_t threads = readers > 0
                       ? static_cast<size_t>(readers)
                       : std::min<size_t>({std::thread::hardware_concurrency(), 8, count / 32});
  threads = std::max<size_t>(1, threads);
  std::atomic<size_t> next{0};
  std::atomic<size_t> known{count};  // items that may be taken without asking
  std::atomic<bool> stop{false};
  std::mutex mutex;  // guards what follows
  std::condition_variable sealedChanged;
  bool sealed = false;  // the prologue has run
  size_t total = count;
  std::exception_ptr failure;
  const auto fail = [&](std::exception_ptr error) {
    const std::lock_guard lock(mutex);
    if (!failure) failure = std::move(error);
    stop.store(true);
  };
  const auto take = [&]() -> std::optional<size_t> {
    const size_t index = next.fetch_add(1);
    if (stop.load()) return std::nullopt;
    if (index < known.load()) return index;
    std::unique_lock lock(mutex);
    sealedChanged.wait(lock, [&] { return sealed; });
    return index < total && !stop.load() ? std::optional<size_t>(index) : std::nullopt;
  };
  const auto run = [&] {
    for (std::optional<size_t> index = take(); index; index = take()) {
      try {
        work(*index);
      } catch (...) {
        fail(std::current_exception());
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) {
    try {
      pool.emplace_back([&] {
        ::unshare(CLONE_FILES);  // where refused, the shared table only costs time
        run();
      });
    } catch (const std::system_error&) {
      break;  // the threads that started, and this one, take the rest
    }
  }
  size_t more = 0;
  try {
    more = prologue();
  } catch (...) {
    fail(std::current_exception());
  }
  {
    const std::lock_guard lock(mutex);
    total = count + more;
    known.store(total);
    sealed = true;
  }
  sealedChanged.notify_all();
  run();
  for (std::thread& thread : pool) {
    thread.join();
  }
  if (failure) std::rethrow_exception(failure);
}

// Removes a temporary directory tree when the scan ends.
class TemporaryTree {
 public:
  TemporaryTree() = default;
  ~TemporaryTree() {
    if (!path_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  TemporaryTree(const TemporaryTree&) = delete;
  TemporaryTree& operator=(const TemporaryTree&) = delete;
  bool Create() {
    std::string pattern = std::filesystem::temp_directory_path().string() + "/gpu-agent-pci.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return false;
    }
    path_ = pattern;
    return true;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class Scanner {
 public:
  explicit Scanner(const ScanOptions& options) : options_(options) {
    root_ = options.root.empty() ? std::string("/") : options.root;
    while (root_.size() > 1 && root_.back() == '/') {
      root_.pop_back();
    }
  }

  HostScan Run() {
    CheckRoot();
    scan_.root = root_;
    // Opened once by absolute path (which umockdev redirects); entries and function directories
    // are walked from them, a name or three each instead of the whole path.
    busPciDevices_.emplace(Path(kBusPciDevices), Directory::Mode::kListable);
    sysDevices_.emplace(Path(kSysDevices));
    std::vector<std::vector<ScanProblem>> problems;  // by entry of sys/bus/pci/devices
    std::vector<Candidate> candidates = ListCandidates(problems);
    MdevListing mdevs;
    ReadAll(candidates, problems, mdevs);
    for (std::vector<ScanProblem>& entryProblems : problems) {
      for (ScanProblem& problem : entryProblems) {
        scan_.problems.push_back(std::move(problem));
      }
    }
    ReportMdevTypeNameErrors(candidates);
    if (unparsableEntries_) {
      StartLibpci(candidates);  // from the readers' findings: not in ReadAll's prologue
    }
    FinishLibpci(candidates);  // the functions, by address
    ReportMissingDriversDirectory();
    ClassifyGpus();
    AttachMdevs(mdevs);
    IndexIommuGroups();
    return std::move(scan_);
  }

 private:
  // What one reader learned of one `sys/bus/mdev/devices` entry.
  struct MdevEntry {
    std::optional<Mdev> mdev;  // when it could be read
    PciAddress parent;
    std::vector<ScanProblem> problems;
  };
  struct MdevListing {
    std::optional<Directory> bus;    // sys/bus/mdev/devices
    DirectoryListing listing;        // its names, or why there are none
    std::vector<MdevEntry> entries;  // by name
  };

  // libpci's part of a scan: its listing of the tree (made on a reader, or after the readers
  // when it must be shown a clean copy of the tree) and its names.
  struct Libpci {
    TemporaryTree shadow;    // the clean copy, when there is one
    std::string busPciPath;  // what libpci was shown; empty when no copy could be made
    std::optional<LibpciSession> session;
    bool listed = false;  // whether session->Scan succeeded
    std::vector<LibpciFunction> functions;
  };

  std::string Path(std::string_view relative) const { return JoinPath(root_, relative); }

  void AddProblem(std::string relativePath, std::string message) {
    scan_.problems.push_back({std::move(relativePath), std::move(message)});
  }

  // A function's directory relative to the root, for messages ("sys/devices/.../0000:3b:00.0").
  std::string Relative(const std::string& absolute) const {
    if (root_ == "/") {
      return absolute.substr(1);
    }
    if (absolute.compare(0, root_.size() + 1, root_ + "/") == 0) {
      return absolute.substr(root_.size() + 1);
    }
    return absolute;
  }

  void CheckRoot() {
    if (!IsDirectory(root_)) {
      throw RootError("sysfs root " + root_ + " does not exist or is not a directory");
    }
    if (!IsDirectory(Path(kBusPciDevices))) {
      throw RootError("sysfs root " + root_ + " holds no sys/bus/pci/devices");
    }
  }

  // Opens a directory given relative to the root: through sys/devices when it lies below it
  // (where every device directory is), else by its whole path.
  Directory OpenUnderRoot(const std::string& relative) const {
    const size_t prefix = kSysDevices.size() + 1;
    if (sysDevices_->ok() && relative.size() > prefix && relative.starts_with(kSysDevices) &&
        relative[prefix - 1] == '/') {
      return Directory(*sysDevices_, relative.substr(prefix), Path(relative));
    }
    return Directory(Path(relative));
  }

  // The real directory behind `sys/bus/pci/devices/<entry>`, opened: the link's target resolved
  // lexically (one readlink instead of a realpath walk), realpath when that does not work.
  // nullopt when neither leads to a directory; a vanished target shows in the handle.
  std::optional<Directory> FunctionDirectory(const std::string& entry) {
    const LinkTarget link = busPciDevices_->ReadLink(entry);
    if (link.status == IoStatus::kOk && !link.target.empty() && link.target.front() != '/') {
      const auto normalized = NormalizeLexically(std::string(kBusPciDevices) + "/" + link.target);
      if (normalized) {
        return OpenUnderRoot(*normalized);
      }
    }
    const std::string entryPath = Path(std::string(kBusPciDevices) + "/" + entry);
    std::array<char, PATH_MAX> resolved{};
    if (::realpath(entryPath.c_str(), resolved.data()) == nullptr ||
        !IsDirectory(resolved.data())) {
      return std::nullopt;
    }
    return std::optional<Directory>(std::in_place, std::string(resolved.data()));
  }

  // The entries of sys/bus/pci/devices that name a PCI function, in listing order; `problems`
  // gets one list per entry, with what is wrong with those that do not.
  std::vector<Candidate> ListCandidates(std::vector<std::vector<ScanProblem>>& problems) {
    const DirectoryListing listing = busPciDevices_->ListEntries();
    if (listing.status != IoStatus::kOk) {
      throw RootError("cannot list " + Path(kBusPciDevices) + ": " + listing.error);
    }
    const size_t count = listing.names.size();
    problems.assign(count, {});
    std::vector<Candidate> candidates;
    candidates.reserve(count);
    for (size_t entry = 0; entry < count; ++entry) {
      const std::string& name = listing.names[entry];
      const auto address = ParsePciAddress(name);
      // sysfs always prints the domain; a short or odd name is not the kernel's.
      if (!address || address->ToString() != ToLower(name) || name.find(':') == 2) {
        problems[entry].push_back(
            {std::string(kBusPciDevices) + "/" + name, "entry is not a PCI address; skipped"});
        unparsableEntries_ = true;
        continue;
      }
      Candidate candidate;
      candidate.entry = name;
      candidate.listed = entry;
      candidate.function.address = *address;
      candidates.push_back(std::move(candidate));
    }
    return candidates;
  }

  // Reads every function's identity before libpci sees the tree: what libpci would choke on
  // (entry names, vendor, device, class) is reported here instead, and what libpci reads with
  // strtol (which takes garbage for 0) is read strictly. One directory handle per function.
  // Functions and mdevs are read on several threads at once (ScanOptions::readers): a scan is
  // system calls, and each function's are its own. Meanwhile this thread has libpci list the
  // tree and loads the names file (unless libpci must be shown a clean copy made from what the
  // readers find), and lists the mdevs, which the readers read after the functions. What the
  // readers share (the drivers and mdev type descriptions asked once per scan) is under
  // cacheMutex_; what they report is kept per entry and gathered in listing order, so the
  // result does not depend on the threads.
  void ReadAll(std::vector<Candidate>& candidates, std::vector<std::vector<ScanProblem>>& problems,
               MdevListing& mdevs) {
    driversDirectoryPresent_ = IsDirectory(Path("sys/bus/pci/drivers"));  // before the readers
    std::vector<char> unregisteredDriver(candidates.size(), 0);
    // Opened before the readers start, which see only what was open then; listed after.
    mdevs.bus.emplace(Path(kBusMdevDevices), Directory::Mode::kListable);
    const auto prologue = [&] {
      if (!unparsableEntries_) {
        StartLibpci(candidates);  // reads no candidate: libpci is shown the tree itself
      }
      ListMdevs(mdevs);
      return mdevs.entries.size();
    };
    ForEachInParallel(candidates.size(), options_.readers, prologue, [&](size_t index) {
      if (index < candidates.size()) {
        Candidate& candidate = candidates[index];
        ReadCandidate(candidate, problems[candidate.listed], unregisteredDriver[index]);
        return;
      }
      index -= candidates.size();
      ReadMdev(*mdevs.bus, mdevs.listing.names[index], mdevs.entries[index]);
    });
    for (const char unregistered : unregisteredDriver) {
      unregisteredDriverLinks_ += unregistered != 0 ? 1 : 0;
    }
  }

  // One function, on a reader thread: its problems go to `problems`, and `unregisteredDriver`
  // says its driver link was taken from its name (a capture without sys/bus/pci/drivers).
  void ReadCandidate(Candidate& candidate, std::vector<ScanProblem>& problems,
                     char& unregisteredDriver) {
    const std::string relative = std::string(kBusPciDevices) + "/" + candidate.entry;
    const std::optional<Directory> opened = FunctionDirectory(candidate.entry);
    if (!opened || !opened->ok()) {
      if (opened) {
        candidate.function.sysfsPath = opened->path();
      }
      problems.push_back({relative, "function vanished or its link dangles; skipped"});
      return;
    }
    const Directory& directory = *opened;
    candidate.function.sysfsPath = directory.path();
    candidate.valid = ReadIdentity(directory, relative, candidate.function, problems);
    if (candidate.valid) {
      PciFunction& function = candidate.function;
      ReadNumaNode(directory, function);
      ReadLinks(directory, function, unregisteredDriver);
      // A GPU, or a VF that may be one (its PF decides later): read the rest through the
      // handle already open.
      if (IsGpuFunction(function.vendorId, function.classCode, options_.extraGpuVendors) ||
          function.physicalFunction) {
        ReadGpuDetails(directory, function);
      }
    }
  }

  // vendor, device and class (mandatory for libpci and for the GPU filter) and the subsystem:
  // from `uevent`, one file where the kernel writes all five; from the five files, each checked
  // and reported by name, when `uevent` is missing or does not hold them well formed.
  bool ReadIdentity(const Directory& directory, const std::string& relative, PciFunction& function,
                    std::vector<ScanProblem>& problems) {
    const FileText uevent = directory.Read("uevent");
    if (uevent.status == IoStatus::kOk) {
      if (const auto identity = ParsePciUevent(uevent.text)) {
        function.vendorId = identity->vendorId;
        function.deviceId = identity->deviceId;
        function.classCode = identity->classCode;
        function.subsystemVendorId = identity->subsystemVendorId;
        function.subsystemDeviceId = identity->subsystemDeviceId;
        return true;
      }
    }
    const auto vendor = ReadMandatory(directory, relative, "vendor", ParseHexId, problems);
    const auto device =
        vendor ? ReadMandatory(directory, relative, "device", ParseHexId, problems) : std::nullopt;
    const auto classCode =
        device ? ReadMandatory(directory, relative, "class", ParseClassCode, problems)
               : std::nullopt;
    if (!vendor || !device || !classCode) {
      return false;
    }
    function.vendorId = *vendor;
    function.deviceId = *device;
    function.classCode = *classCode;
    ReadSubsystem(directory, function);
    return true;
  }

  template <typename Parser>
  auto ReadMandatory(const Directory& directory, const std::string& relative,
                     const std::string& attribute, Parser parse, std::vector<ScanProblem>& problems)
      -> std::optional<std::decay_t<decltype(*parse(std::string_view()))>> {
    const FileText file = directory.Read(attribute);
    if (file.status != IoStatus::kOk) {
      problems.push_back({relative + "/" + attribute,
                          std::string("cannot read: ") +
                              (file.status == IoStatus::kMissing ? "missing" : file.error) +
                              "; skipped"});
      return std::nullopt;
    }
    const auto parsed = parse(file.text);
    if (!parsed) {
      problems.push_back({relative + "/" + attribute, parsed.error() + "; skipped"});
      return std::nullopt;
    }
    return *parsed;
  }

  // libpci reads `<sysfs.path>/devices` and gives up on the whole scan at one entry it cannot
  // parse. When there is one, it is shown a copy of `devices/` holding only the good entries.
  std::string BusPciPathForLibpci(const std::vector<Candidate>& candidates, TemporaryTree& shadow) {
    const std::string busPci = Path("sys/bus/pci");
    if (!unparsableEntries_) {
      return busPci;
    }
    if (!shadow.Create()) {
      return {};
    }
    std::error_code error;
    std::filesystem::create_directory(shadow.path() + "/devices", error);
    for (const Candidate& candidate : candidates) {
      if (candidate.function.sysfsPath.empty()) {
        continue;
      }
      std::filesystem::create_directory_symlink(
          candidate.function.sysfsPath, shadow.path() + "/devices/" + candidate.entry, error);
    }
    if (IsDirectory(busPci + "/slots")) {
      std::filesystem::create_directory_symlink(busPci + "/slots", shadow.path() + "/slots", error);
    }
    return shadow.path();
  }

  // libpci's listing of the tree, and its names file loaded. Once, on the calling thread.
  void StartLibpci(const std::vector<Candidate>& candidates) {
    libpci_.busPciPath = BusPciPathForLibpci(candidates, libpci_.shadow);
    if (libpci_.busPciPath.empty()) {
      return;
    }
    libpci_.session.emplace(libpci_.busPciPath, options_.pciIdsPath);
    libpci_.listed = libpci_.session->Scan(libpci_.functions);
    if (libpci_.listed) {
      libpci_.session->LoadNames();
    }
  }

  // The functions libpci listed, named, in its order; what it said, after them.
  void FinishLibpci(std::vector<Candidate>& candidates) {
    if (libpci_.busPciPath.empty()) {
      AddProblem("sys/bus/pci/devices", "cannot prepare a clean view for libpci; scan skipped");
      return;
    }
    LibpciSession& libpci = *libpci_.session;
    if (!libpci_.listed) {
      AddProblem("sys/bus/pci/devices", libpci.error());
      return;
    }
    // libpci is the enumerator: a function it does not list (gone since) is not reported, nor
    // one it lists that the readers could not read (reported by them) or did not see (appeared
    // since: the next scan takes it). The functions are put in address order as pointers: a
    // PciFunction is large, and each is moved once.
    std::vector<const PciAddress*> listed;
    listed.reserve(libpci_.functions.size());
    for (const LibpciFunction& entry : libpci_.functions) {
      listed.push_back(&entry.address);
    }
    std::vector<Candidate*> valid;
    valid.reserve(candidates.size());
    for (Candidate& candidate : candidates) {
      if (candidate.valid) {
        valid.push_back(&candidate);
      }
    }
    const auto byAddress = [](const auto* a, const auto* b) { return *a < *b; };
    std::sort(listed.begin(), listed.end(), byAddress);
    std::sort(valid.begin(), valid.end(), [](const Candidate* a, const Candidate* b) {
      return a->function.address < b->function.address;
    });
    scan_.functions.reserve(valid.size());
    auto next = listed.begin();
    for (Candidate* candidate : valid) {
      const PciAddress& address = candidate->function.address;
      while (next != listed.end() && **next < address) {
        ++next;
      }
      if (next == listed.end() || address < **next) {
        continue;
      }
      PciFunction& function = scan_.functions.emplace_back(std::move(candidate->function));
      function.vendorName = libpci.VendorName(function.vendorId);
      function.deviceName = libpci.DeviceName(function.vendorId, function.deviceId);
    }
    for (const std::string& warning : libpci.TakeWarnings()) {
      AddProblem("sys/bus/pci", "libpci: " + InRoot(warning, libpci_.busPciPath));
    }
    libpci_.functions.clear();
    libpci_.session.reset();  // and the names file with it: the rest of the scan needs neither
  }

  // Link targets are taken by their basename, also when the target is missing (captured trees
  // such as umockdev dumps lack them); a dangling `driver` link is still worth a report.
  void ReadLinks(const Directory& directory, PciFunction& function, char& unregisteredDriver) {
    const LinkTarget driver = directory.ReadLink("driver");
    if (driver.status == IoStatus::kOk) {
      function.driver = std::string(LinkBasename(driver.target));
      if (!driversDirectoryPresent_) {
        unregisteredDriver = 1;  // a capture without drivers: said once, in Run
      } else if (!DriverRegistered(*function.driver)) {
        function.problems.push_back(Relative(function.sysfsPath) + "/driver: link target " +
                                    driver.target + " is missing");
      }
    } else if (driver.status == IoStatus::kError) {
      function.problems.push_back(Relative(function.sysfsPath) + "/driver: " + driver.error);
    }
    const LinkTarget group = directory.ReadLink("iommu_group");
    if (group.status == IoStatus::kOk) {
      const auto number = ParseUnsigned(LinkBasename(group.target));
      if (number) {
        function.iommuGroup = *number;
      } else {
        function.problems.push_back(Relative(function.sysfsPath) +
                                    "/iommu_group: " + number.error());
      }
    } else if (group.status == IoStatus::kError) {
      function.problems.push_back(Relative(function.sysfsPath) + "/iommu_group: " + group.error);
    }
    // Only a GPU vendor's function can be a GPU's VF (its physfn decides).
    if (!IsGpuVendor(function.vendorId, options_.extraGpuVendors)) {
      return;
    }
    const LinkTarget physfn = directory.ReadLink("physfn");
    if (physfn.status == IoStatus::kOk) {
      const auto parent = ParsePciAddress(LinkBasename(physfn.target));
      if (parent) {
        function.physicalFunction = *parent;
      } else {
        function.problems.push_back(Relative(function.sysfsPath) + "/physfn: target " +
                                    physfn.target + " is not a PCI address");
      }
    }
  }

  // One line for a tree without a drivers directory, instead of one per bound function.
  void ReportMissingDriversDirectory() {
    if (unregisteredDriverLinks_ > 0) {
      AddProblem("sys/bus/pci/drivers",
                 "missing (a captured tree?); " + std::to_string(unregisteredDriverLinks_) +
                     " functions' drivers taken from their driver links' names");
    }
  }

  // Whether sys/bus/pci/drivers/<name> exists, asked once per driver and scan. Any reader.
  bool DriverRegistered(const std::string& name) {
    const std::lock_guard lock(cacheMutex_);
    const auto known = registeredDrivers_.find(name);
    if (known != registeredDrivers_.end()) {
      return known->second;
    }
    const bool registered = IsDirectory(Path("sys/bus/pci/drivers/" + name));
    registeredDrivers_[name] = registered;
    return registered;
  }

  void ClassifyGpus() {
    for (PciFunction& function : scan_.functions) {
      function.isGpu =
          IsGpuFunction(function.vendorId, function.classCode, options_.extraGpuVendors);
    }
    for (PciFunction& function : scan_.functions) {
      if (!function.isGpu && function.physicalFunction) {
        const PciFunction* pf = scan_.Find(*function.physicalFunction);
        function.isGpu = pf != nullptr && pf->isGpu;
      }
    }
  }

  // Reads an optional attribute; a present but unreadable or malformed one is a problem.
  // `relativeFile` is below `directory`, which is `within` below the function's directory.
  template <typename T, typename Parser>
  std::optional<T> ReadOptional(const Directory& directory, PciFunction& function,
                                const std::string& relativeFile, Parser parse,
                                std::string_view within = {}) {
    const FileText file = directory.Read(relativeFile);
    if (file.status == IoStatus::kMissing) {
      return std::nullopt;
    }
    // Where, for a problem only: most attributes read fine, and the path costs an allocation.
    const auto where = [&] {
      return Relative(function.sysfsPath) + "/" + std::string(within) + relativeFile;
    };
    if (file.status == IoStatus::kError) {
      function.problems.push_back(where() + ": " + file.error);
      return std::nullopt;
    }
    auto parsed = parse(file.text);
    if (!parsed) {
      function.problems.push_back(where() + ": " + parsed.error());
      return std::nullopt;
    }
    return T(*parsed);
  }

  void ReadSubsystem(const Directory& directory, PciFunction& function) {
    const auto vendor = ReadOptional<uint16_t>(directory, function, "subsystem_vendor", ParseHexId);
    const auto device = ReadOptional<uint16_t>(directory, function, "subsystem_device", ParseHexId);
    if (vendor && device) {
      function.subsystemVendorId = *vendor;
      function.subsystemDeviceId = *device;
    }
  }

  // libpci reads numa_node with strtol, which takes garbage for node 0: read it strictly.
  void ReadNumaNode(const Directory& directory, PciFunction& function) {
    const auto numa =
        ReadOptional<std::optional<int32_t>>(directory, function, "numa_node", ParseNumaNode);
    if (numa) {
      function.numaNode = *numa;
    }
  }

  // libpci names files by its sysfs.path (a temporary view, sometimes): say them from the root.
  std::string InRoot(const std::string& message, const std::string& busPciPath) const {
    std::string out = message;
    const size_t at = out.find(busPciPath);
    if (at != std::string::npos) {
      out.replace(at, busPciPath.size(), "sys/bus/pci");
    }
    return out;
  }

  void ReadGpuDetails(const Directory& directory, PciFunction& function) {
    // A VF has no sriov_* files.
    const auto totalVfs =
        function.physicalFunction
            ? std::nullopt
            : ReadOptional<uint32_t>(directory, function, "sriov_totalvfs", ParseUnsigned);
    if (totalVfs) {
      SriovInfo sriov;
      sriov.totalVfs = *totalVfs;
      sriov.numVfs =
          ReadOptional<uint32_t>(directory, function, "sriov_numvfs", ParseUnsigned).value_or(0);
      function.sriov = sriov;
    }
    ReadMdevTypes(directory, function);
    ReadNvidiaVgpu(directory, function);
  }

  void ReadMdevTypes(const Directory& directory, PciFunction& function) {
    static constexpr std::string_view kTypes = "mdev_supported_types/";
    // Listed and read through one handle: each type's files are two names below it.
    const Directory typesDirectory(directory, std::string(kTypes), {}, Directory::Mode::kListable);
    DirectoryListing types = typesDirectory.ListEntries();
    if (types.status == IoStatus::kMissing) {
      return;
    }
    if (types.status == IoStatus::kError) {
      function.problems.push_back(Relative(function.sysfsPath) +
                                  "/mdev_supported_types: " + types.error);
      return;
    }
    // Sorted by type: the names sort cheaper than the entries read from them.
    std::sort(types.names.begin(), types.names.end());
    function.mdevTypes.reserve(types.names.size());
    std::string typePath;
    for (const std::string& typeName : types.names) {
      MdevType type;
      type.type = typeName;
      // One buffer for every type's path: a path per type was an allocation per type.
      typePath.assign(typeName).append("/available_instances");
      const auto available =
          ReadOptional<uint32_t>(typesDirectory, function, typePath, ParseUnsigned, kTypes);
      if (available) {
        type.availableInstances = *available;
      }
      // A type's name, description and device API are the driver's, the same on every parent
      // (a VF of each of 16 GPUs offers the same nvidia-1145): read once per scan.
      const MdevType& shared = MdevTypeDescription(typesDirectory, typeName);
      type.name = shared.name;
      type.maxInstances = shared.maxInstances;
      type.deviceApi = shared.deviceApi;
      function.mdevTypes.push_back(std::move(type));
    }
  }

  // A type's description, read the first time any reader asks (under cacheMutex_; the entries
  // of a std::map stay where they are, so the reference outlives the lock). A `name` that
  // cannot be read is kept by type and reported once, after the readers, for the first
  // function in listing order that offers the type (ReportMdevTypeNameErrors).
  // `directory` is the parent's mdev_supported_types.
  const MdevType& MdevTypeDescription(const Directory& directory, const std::string& typeName) {
    const std::lock_guard lock(cacheMutex_);
    const auto known = mdevTypeDescriptions_.find(typeName);
    if (known != mdevTypeDescriptions_.end()) {
      return known->second;
    }
    MdevType type;
    const std::string base = typeName + "/";
    const FileText name = directory.Read(base + "name");
    if (name.status == IoStatus::kOk) {
      type.name = std::string(TrimAttribute(name.text));
    } else if (name.status == IoStatus::kError) {
      mdevTypeNameErrors_[typeName] = name.error;
    }
    const FileText description = directory.Read(base + "description");
    if (description.status == IoStatus::kOk) {
      type.maxInstances = MaxInstancesFromDescription(description.text);
    }
    const FileText deviceApi = directory.Read(base + "device_api");
    if (deviceApi.status == IoStatus::kOk) {
      type.deviceApi = std::string(TrimAttribute(deviceApi.text));
    }
    return mdevTypeDescriptions_.emplace(typeName, std::move(type)).first->second;
  }

  void ReportMdevTypeNameErrors(std::vector<Candidate>& candidates) {
    for (Candidate& candidate : candidates) {
      if (mdevTypeNameErrors_.empty()) {
        return;
      }
      PciFunction& function = candidate.function;
      for (const MdevType& type : function.mdevTypes) {
        const auto error = mdevTypeNameErrors_.find(type.type);
        if (error != mdevTypeNameErrors_.end()) {
          function.problems.push_back(Relative(function.sysfsPath) + "/mdev_supported_types/" +
                                      type.type + "/name: " + error->second);
          mdevTypeNameErrors_.erase(error);
        }
      }
    }
  }

  void ReadNvidiaVgpu(const Directory& directory, PciFunction& function) {
    if (!directory.IsSubdirectory("nvidia")) {
      return;
    }
    const auto creatable = ReadOptional<std::vector<VgpuTypeEntry>>(
        directory, function, "nvidia/creatable_vgpu_types", ParseCreatableVgpuTypes);
    const auto current =
        ReadOptional<uint32_t>(directory, function, "nvidia/current_vgpu_type", ParseUnsigned);
    NvidiaVgpu vgpu;
    if (creatable) {
      vgpu.creatableTypes = *creatable;
    }
    if (current && *current != 0) {
      vgpu.currentType = std::to_string(*current);
    }
    function.vgpu = std::move(vgpu);
  }

  // Mediated devices are found through `sys/bus/mdev/devices`, which lists them even when a
  // parent has no `mdev_supported_types` (captured trees) and before their type link exists.
  // They are read with the functions (ReadAll) and attached to them after (AttachMdevs).
  // `mdevs.bus` is open: the readers' descriptor tables are copies made when they started.
  static void ListMdevs(MdevListing& mdevs) {
    mdevs.listing = mdevs.bus->ListEntries();
    mdevs.entries.resize(mdevs.listing.names.size());
  }

  void AttachMdevs(MdevListing& mdevs) {
    if (mdevs.listing.status == IoStatus::kMissing) {
      return;
    }
    if (mdevs.listing.status == IoStatus::kError) {
      AddProblem(std::string(kBusMdevDevices), mdevs.listing.error);
      return;
    }
    for (size_t index = 0; index < mdevs.entries.size(); ++index) {
      MdevEntry& entry = mdevs.entries[index];
      for (ScanProblem& problem : entry.problems) {
        scan_.problems.push_back(std::move(problem));
      }
      if (!entry.mdev) {
        continue;
      }
      scan_.mdevLinksPending = scan_.mdevLinksPending || !entry.mdev->type;
      scan_.mdevParents[entry.mdev->uuid] = entry.parent;
      auto it =
          std::lower_bound(scan_.functions.begin(), scan_.functions.end(), entry.parent,
                           [](const PciFunction& f, const PciAddress& a) { return f.address < a; });
      if (it != scan_.functions.end() && it->address == entry.parent) {
        it->mdevs.push_back(std::move(*entry.mdev));
      } else {
        AddProblem(std::string(kBusMdevDevices) + "/" + mdevs.listing.names[index],
                   "parent " + entry.parent.ToString() + " is not a scanned PCI function");
      }
    }
    for (PciFunction& function : scan_.functions) {
      std::sort(function.mdevs.begin(), function.mdevs.end(),
                [](const Mdev& a, const Mdev& b) { return a.uuid < b.uuid; });
    }
  }

  // One entry of `bus` (sys/bus/mdev/devices), on a reader thread.
  void ReadMdev(const Directory& bus, const std::string& name, MdevEntry& entry) const {
    const std::string relative = std::string(kBusMdevDevices) + "/" + name;
    if (!IsMdevUuid(name)) {
      entry.problems.push_back({relative, "entry is not an mdev UUID; skipped"});
      return;
    }
    const LinkTarget link = bus.ReadLink(name);
    if (link.status != IoStatus::kOk) {
      entry.problems.push_back({relative, "cannot read link: " + link.error});
      return;
    }
    const auto parent = ParsePciAddress(LinkParentName(link.target));
    if (!parent) {
      entry.problems.push_back(
          {relative, "link target " + link.target + " names no PCI parent; skipped"});
      return;
    }
    Mdev mdev;
    mdev.uuid = ToLower(name);
    // Read through the device's own directory (the link's target, resolved lexically).
    const auto normalized = NormalizeLexically(std::string(kBusMdevDevices) + "/" + link.target);
    const Directory directory =
        normalized ? OpenUnderRoot(*normalized) : Directory(bus, name, Path(relative));
    if (!directory.ok()) {
      entry.problems.push_back(
          {relative, "mdev vanished or its link dangles: " + directory.error()});
      return;
    }
    const LinkTarget type = directory.ReadLink("mdev_type");
    if (type.status == IoStatus::kOk) {
      mdev.type = std::string(LinkBasename(type.target));
    }
    const LinkTarget group = directory.ReadLink("iommu_group");
    if (group.status == IoStatus::kOk) {
      const auto number = ParseUnsigned(LinkBasename(group.target));
      if (number) {
        mdev.iommuGroup = *number;
      }
    }
    const LinkTarget driver = directory.ReadLink("driver");
    if (driver.status == IoStatus::kOk) {
      mdev.driver = std::string(LinkBasename(driver.target));
    }
    entry.parent = *parent;
    entry.mdev = std::move(mdev);
  }

  static bool HandsOverToVm(const PciFunction& member) {
    if (member.IsBridge() || !member.driver) {
      return true;
    }
    const std::string& driver = *member.driver;
    return driver == "pci-stub" || driver.find("vfio") != std::string::npos;
  }

  void IndexIommuGroups() {
    for (const PciFunction& function : scan_.functions) {
      if (function.iommuGroup) {
        scan_.iommuGroups[*function.iommuGroup].push_back(function.address);
      }
    }
    for (PciFunction& function : scan_.functions) {
      if (!function.isGpu || !function.iommuGroup) {
        continue;
      }
      bool viable = true;
      for (const PciAddress& memberAddress : scan_.iommuGroups[*function.iommuGroup]) {
        const PciFunction* member = scan_.Find(memberAddress);
        if (member != nullptr && member != &function && !HandsOverToVm(*member)) {
          viable = false;
        }
      }
      function.iommuGroupViable = viable;
    }
  }

  const ScanOptions& options_;
  std::string root_;
  std::optional<Directory> busPciDevices_;  // <root>/sys/bus/pci/devices, from Run on
  std::optional<Directory> sysDevices_;     // <root>/sys/devices, from Run on
  Libpci libpci_;
  HostScan scan_;
  bool unparsableEntries_ = false;
  std::map<std::string, bool> registeredDrivers_;
  // Whether sys/bus/pci/drivers exists at all: a live host always has it; a captured tree
  // (umockdev records device directories only) may not, and then every driver link dangles.
  bool driversDirectoryPresent_ = false;
  size_t unregisteredDriverLinks_ = 0;
  std::mutex cacheMutex_;  // registeredDrivers_, mdevTypeDescriptions_, mdevTypeNameErrors_
  std::map<std::string, MdevType> mdevTypeDescriptions_;
  std::map<std::string, std::string> mdevTypeNameErrors_;  // type -> why its name is unread
};

}  // namespace

bool IsGpuVendor(uint16_t vendorId, const std::vector<uint16_t>& extraVendors) {
  return vendorId == kVendorNvidia || vendorId == kVendorAmd || vendorId == kVendorIntel ||
         std::find(extraVendors.begin(), extraVendors.end(), vendorId) != extraVendors.end();
}

bool IsGpuFunction(uint16_t vendorId, uint32_t classCode,
                   const std::vector<uint16_t>& extraVendors) {
  const uint32_t baseClass = classCode >> 16;
  if (baseClass == 0x03) {
    return IsGpuVendor(vendorId, extraVendors);
  }
  // AMD Instinct MI300 parts (and their VFs) are processing accelerators, class 0x1200.
  return baseClass == 0x12 && (classCode >> 8) == 0x1200 && vendorId == kVendorAmd;
}

HostScan ScanHost(const ScanOptions& options) { return Scanner(options).Run(); }

}  // namespace cozy::sysfs
