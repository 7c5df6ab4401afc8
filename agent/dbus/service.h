// The agent on D-Bus (DESIGN §4.6): name and interface io.cozystack.GPUAgent1 on object
// /io/cozystack/GPUAgent1, as io.cozystack.GPUAgent1.xml beside this file describes it. The
// connection is a source on the daemon's sd-event loop (its socket and its timeout), never a
// thread of its own; a bus that is absent, refuses the name or goes away costs D-Bus only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/loop.h"

namespace sdbus {
class IConnection;
}

namespace cozy::agent {

inline constexpr const char* kDbusName = "io.cozystack.GPUAgent1";
inline constexpr const char* kDbusObjectPath = "/io/cozystack/GPUAgent1";

class DbusObject;

class DbusService {
 public:
  struct Callbacks {
    std::function<std::string()> inventory;  // the Inventory property's value now
    std::function<void()> rescan;            // Rescan(): one pass, done when it returns
    std::function<void()> stateChanged;      // connected() flipped
  };

  // `bus`: "system" or "session"; the addresses come from sd-bus's usual places
  // (DBUS_SYSTEM_BUS_ADDRESS, DBUS_SESSION_BUS_ADDRESS, else the well-known sockets).
  DbusService(runtime::Loop& loop, std::string bus, Callbacks callbacks);
  ~DbusService();
  DbusService(const DbusService&) = delete;
  DbusService& operator=(const DbusService&) = delete;

  // Connects, exports the object and takes the name. On failure it logs why (naming the bus
  // and the name) and tries again later, backing off up to a minute.
  void Start();
  // While connected: InventoryChanged(inventory), and PropertiesChanged invalidating Inventory.
  void InventoryChanged(const std::string& inventory);
  bool connected() const { return object_ != nullptr; }

 private:
  bool Connect(std::string& error);
  void Process();
  void Watch();
  void Drop(const std::string& reason);
  void ScheduleRetry();

  runtime::Loop& loop_;
  std::string bus_;
  Callbacks callbacks_;
  std::unique_ptr<sdbus::IConnection> connection_;
  std::unique_ptr<DbusObject> object_;  // set while connected and owning the name
  runtime::Io io_;                      // the bus socket, while connected
  runtime::Timer busTimer_;             // sd-bus's own deadline (method call timeouts)
  runtime::Timer retryTimer_;           // the next connection attempt
  std::chrono::milliseconds retryDelay_{std::chrono::seconds(1)};
  std::string lastError_;
  bool processing_ = false;  // inside processPendingRequest (a method call being answered)
};

}  // namespace cozy::agent
