#include "agent/dbus/service.h"

#include <sys/epoll.h>
#include <time.h>

#include <sdbus-c++/sdbus-c++.h>
#include <algorithm>

// Generated at build time from io.cozystack.GPUAgent1.xml (agent/CMakeLists.txt).
#include "gpu_agent1_adaptor.h"

#include "runtime/log.h"

namespace cozy::agent {

using runtime::LogDebug;
using runtime::LogError;
using runtime::LogInfo;
using runtime::LogWarning;

// The exported object: the generated adaptor's pure virtuals, answered through the callbacks.
class DbusObject final : public sdbus::AdaptorInterfaces<io::cozystack::GPUAgent1_adaptor> {
 public:
  DbusObject(sdbus::IConnection& connection, const DbusService::Callbacks& callbacks)
      : AdaptorInterfaces(connection, kDbusObjectPath), callbacks_(callbacks) {
    registerAdaptor();
  }
  ~DbusObject() { unregisterAdaptor(); }
  DbusObject(const DbusObject&) = delete;
  DbusObject& operator=(const DbusObject&) = delete;

  void Announce(const std::string& inventory) {
    emitInventoryChanged(inventory);
    getObject().emitPropertiesChangedSignal(INTERFACE_NAME, {"Inventory"});
  }

 private:
  // sd-bus calls these from C: anything but sdbus::Error must not escape, so other failures
  // become a D-Bus error reply.
  void Rescan() override {
    try {
      callbacks_.rescan();
    } catch (const std::exception& error) {
      throw sdbus::Error("org.freedesktop.DBus.Error.Failed", error.what());
    }
  }
  std::string Inventory() override {
    try {
      return callbacks_.inventory();
    } catch (const std::exception& error) {
      throw sdbus::Error("org.freedesktop.DBus.Error.Failed", error.what());
    }
  }

  const DbusService::Callbacks& callbacks_;
};

DbusService::DbusService(runtime::Loop& loop, std::string bus, Callbacks callbacks)
    : loop_(loop), bus_(std::move(bus)), callbacks_(std::move(callbacks)) {
  busTimer_ = loop_.AddTimer("D-Bus call deadline", [this] {
    if (connected()) {
      Process();
    }
  });
  retryTimer_ = loop_.AddTimer("D-Bus reconnect", [this] { Start(); });
}

DbusService::~DbusService() {
  io_.Reset();
  busTimer_.Reset();
  retryTimer_.Reset();
  object_.reset();  // before its connection
  connection_.reset();
}

void DbusService::Start() {
  std::string error;
  if (!Connect(error)) {
    // Logged as an error once; the same failure on every retry is not news.
    if (error != lastError_) {
      LogError("cannot serve on D-Bus; going on without it and retrying",
               {{"bus", bus_}, {"name", kDbusName}, {"reason", error}});
      lastError_ = error;
    } else {
      LogDebug("D-Bus still unavailable", {{"bus", bus_}, {"reason", error}});
    }
    ScheduleRetry();
    return;
  }
  lastError_.clear();
  retryDelay_ = std::chrono::seconds(1);
  LogInfo("serving on D-Bus", {{"bus", bus_}, {"name", kDbusName}, {"object", kDbusObjectPath}});
  if (callbacks_.stateChanged) {
    callbacks_.stateChanged();
  }
}

bool DbusService::Connect(std::string& error) {
  try {
    connection_ = bus_ == "session" ? sdbus::createSessionBusConnection()
                                    : sdbus::createSystemBusConnection();
    // RequestName is a blocking call on the bus: a hung bus must not stall the agent long.
    connection_->setMethodCallTimeout(std::chrono::seconds(5));
    // The object first, so that whoever sees the name appear finds it there.
    object_ = std::make_unique<DbusObject>(*connection_, callbacks_);
    connection_->requestName(kDbusName);
    Watch();
    return true;
  } catch (const sdbus::Error& failure) {
    error = failure.getMessage().empty() ? failure.what() : failure.getMessage();
    // sd-bus's names for the errno of RequestName's refusal.
    if (failure.getName() == "org.freedesktop.DBus.Error.FileExists") {
      error += ": another process owns the name";
    } else if (failure.getName() == "org.freedesktop.DBus.Error.AccessDenied") {
      error += ": the bus policy does not let this user own the name";
    }
  }
  io_.Reset();
  object_.reset();
  connection_.reset();
  return false;
}

// sd-bus says what it waits for (its socket's events, and an absolute deadline on
// CLOCK_MONOTONIC for pending calls); the loop's sources are set to exactly that.
void DbusService::Watch() {
  const sdbus::IConnection::PollData poll = connection_->getEventLoopPollData();
  const auto events = static_cast<uint32_t>(static_cast<uint16_t>(poll.events));
  if (!io_) {
    try {
      io_ = loop_.AddIo("D-Bus socket", poll.fd, events, [this](uint32_t) { Process(); });
    } catch (const runtime::LoopError& error) {
      throw sdbus::Error(
          "org.freedesktop.DBus.Error.Failed",
          std::string("cannot watch the bus socket on the event loop: ") + error.what());
    }
  } else {
    io_.SetEvents(events);
  }
  if (poll.timeout_usec == UINT64_MAX) {
    busTimer_.Cancel();
  } else {
    // sd-bus gives an absolute CLOCK_MONOTONIC deadline; the timer takes a delay.
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const uint64_t nowUsec =
        static_cast<uint64_t>(now.tv_sec) * 1000000U + static_cast<uint64_t>(now.tv_nsec) / 1000U;
    const uint64_t delayUsec = poll.timeout_usec > nowUsec ? poll.timeout_usec - nowUsec : 0;
    busTimer_.Arm(std::chrono::milliseconds((delayUsec + 999U) / 1000U));
  }
}

// Everything sd-bus has ready (method calls are answered in here, on the loop), then the
// sources are re-armed for what it waits for next.
void DbusService::Process() {
  try {
    processing_ = true;
    while (connection_->processPendingRequest()) {
    }
    processing_ = false;
    Watch();
  } catch (const sdbus::Error& failure) {
    processing_ = false;
    Drop(failure.what());
  }
}

void DbusService::InventoryChanged(const std::string& inventory) {
  if (!connected()) {
    return;
  }
  try {
    object_->Announce(inventory);
    // A full socket leaves the message queued: listen for POLLOUT until it is written.
    if (!processing_) {
      Watch();
    }
  } catch (const sdbus::Error& failure) {
    // Inside a method call (Rescan) the connection is dropped by Process, which sees the same
    // failure next; outside, now.
    if (!processing_) {
      Drop(failure.what());
    }
  }
}

void DbusService::Drop(const std::string& reason) {
  LogError("lost the D-Bus connection; going on without it and reconnecting",
           {{"bus", bus_}, {"name", kDbusName}, {"reason", reason}});
  io_.Reset();
  busTimer_.Cancel();
  object_.reset();
  connection_.reset();
  lastError_ = reason;
  if (callbacks_.stateChanged) {
    callbacks_.stateChanged();
  }
  ScheduleRetry();
}

void DbusService::ScheduleRetry() {
  retryTimer_.Arm(retryDelay_);
  retryDelay_ = std::min<std::chrono::milliseconds>(retryDelay_ * 2, std::chrono::minutes(1));
}

}  // namespace cozy::agent
