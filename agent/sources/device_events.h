// sysfs discovery's trigger: the kernel's (or udev's) device events for pci, mdev and vfio, read
// from a netlink monitor on the loop. Each event asks for a debounced pass; the pass itself reads
// sysfs and NVIDIA's procfs (agent/status/scan_pass.h).
#pragma once

#include <string>

#include "agent/sources/source.h"

struct udev;
struct udev_monitor;

namespace cozy::agent {

class DeviceEvents : public Source {
 public:
  // "auto" (udev if /run/udev/control exists, else kernel), "udev", "kernel" or "off".
  explicit DeviceEvents(std::string source);
  ~DeviceEvents() override;
  DeviceEvents(const DeviceEvents&) = delete;
  DeviceEvents& operator=(const DeviceEvents&) = delete;

  std::string_view Name() const override { return "device events"; }
  void Start(runtime::Loop& loop, Changed changed) override;
  int64_t events() const { return events_; }

 private:
  void Receive();

  std::string source_;
  udev* udev_ = nullptr;
  udev_monitor* monitor_ = nullptr;
  runtime::Io io_;
  Changed changed_;
  int64_t events_ = 0;
};

}  // namespace cozy::agent
