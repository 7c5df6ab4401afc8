#include "agent/sources/device_events.h"

#include <libudev.h>
#include <sys/epoll.h>

#include "runtime/log.h"
#include "sysfs/sysfs_io.h"

namespace cozy::agent {

DeviceEvents::DeviceEvents(std::string source) : source_(std::move(source)) {}

DeviceEvents::~DeviceEvents() {
  io_.Reset();
  if (monitor_ != nullptr) {
    udev_monitor_unref(monitor_);
  }
  if (udev_ != nullptr) {
    udev_unref(udev_);
  }
}

void DeviceEvents::Start(runtime::Loop& loop, Changed changed) {
  changed_ = std::move(changed);
  std::string source = source_;
  if (source == "off") {
    runtime::LogInfo("device events off; rescans on timers and SIGHUP only");
    return;
  }
  if (source == "auto") {
    // A udev-group monitor hears nothing without udevd (a container without /run/udev).
    source = sysfs::PathExists("/run/udev/control") ? "udev" : "kernel";
  }
  udev_ = udev_new();
  monitor_ = udev_ == nullptr ? nullptr : udev_monitor_new_from_netlink(udev_, source.c_str());
  if (monitor_ == nullptr) {
    runtime::LogWarning("cannot open the udev monitor; rescans on timers and SIGHUP only",
                        {{"source", source}});
    return;
  }
  for (const char* subsystem : {"pci", "mdev", "vfio"}) {
    udev_monitor_filter_add_match_subsystem_devtype(monitor_, subsystem, nullptr);
  }
  if (udev_monitor_enable_receiving(monitor_) < 0) {
    runtime::LogWarning(
        "cannot receive udev events (kernel events need the host network namespace); "
        "rescans on timers and SIGHUP only",
        {{"source", source}});
    udev_monitor_unref(monitor_);
    monitor_ = nullptr;
    return;
  }
  io_ = loop.AddIo("udev monitor", udev_monitor_get_fd(monitor_), EPOLLIN,
                   [this](uint32_t) { Receive(); });
  runtime::LogInfo("listening for device events",
                   {{"source", source}, {"subsystems", "pci,mdev,vfio"}});
}

void DeviceEvents::Receive() {
  while (udev_device* device = udev_monitor_receive_device(monitor_)) {
    ++events_;
    const char* action = udev_device_get_action(device);
    const char* subsystem = udev_device_get_subsystem(device);
    const char* sysname = udev_device_get_sysname(device);
    runtime::LogDebug("device event", {{"action", action != nullptr ? action : ""},
                                       {"subsystem", subsystem != nullptr ? subsystem : ""},
                                       {"device", sysname != nullptr ? sysname : ""}});
    udev_device_unref(device);
    changed_("device event", true);
  }
}

}  // namespace cozy::agent
