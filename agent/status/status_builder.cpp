#include "agent/status/status_builder.h"

#include <map>

#include "agent/status/json_sinks.h"
#include "api/gpunode.h"

namespace cozy::agent {
namespace {

// The GPUNode, written once for both sinks (json_sinks.h). Every object's keys are written in
// byte order, the order the document keeps them in; JsonPrinter refuses any other.
template <typename Sink>
class StatusWriter {
 public:
  explicit StatusWriter(Sink& out) : out_(out) {}

  void Device(const sysfs::PciFunction& function, const FunctionUnits* units) {
    out_.BeginObject();
    if (units != nullptr) {
      Field("allocatable", units->allocatable);
      Field("allocated", units->allocated);
    }
    Field("classCode", sysfs::FormatHex(function.classCode, 6));
    Field("deviceID", sysfs::FormatHex(function.deviceId, 4));
    if (function.driver) {
      Field("driver", *function.driver);
    }
    if (units != nullptr) {
      Field("health", ToString(units->health));
    }
    if (function.iommuGroup) {
      Field("iommuGroup", *function.iommuGroup);
      if (function.iommuGroupViable) {
        Field("iommuGroupViable", *function.iommuGroupViable);
      }
    }
    MdevTypes(function.mdevTypes);
    Mdevs(function.mdevs);
    if (!function.deviceName.empty()) {
      Field("model", function.deviceName);
    }
    if (function.numaNode) {
      Field("numaNode", *function.numaNode);
    }
    Field("pciAddress", function.address.ToString());
    if (function.physicalFunction) {
      Field("physicalFunction", function.physicalFunction->ToString());
    }
    if (units != nullptr && !units->resources.empty()) {
      out_.Key("resources");
      out_.BeginArray();
      for (const ResourceUnits& resource : units->resources) {
        out_.BeginObject();
        Field("allocatable", resource.allocatable);
        Field("allocated", resource.allocated);
        Field("name", resource.name);
        out_.EndObject();
      }
      out_.EndArray();
    }
    if (function.sriov) {
      out_.Key("sriov");
      out_.BeginObject();
      Field("numVFs", function.sriov->numVfs);
      Field("totalVFs", function.sriov->totalVfs);
      out_.EndObject();
    }
    if (function.subsystemVendorId && function.subsystemDeviceId) {
      Field("subsystemDeviceID", sysfs::FormatHex(*function.subsystemDeviceId, 4));
      Field("subsystemVendorID", sysfs::FormatHex(*function.subsystemVendorId, 4));
    }
    if (!function.vendorName.empty()) {
      Field("vendor", function.vendorName);
    }
    Field("vendorID", sysfs::FormatHex(function.vendorId, 4));
    if (function.vgpu) Vgpu(*function.vgpu);
    out_.EndObject();
  }

  void Status(const sysfs::HostScan& scan, const UnitReport* units, const StaleUnits* stale) {
    std::map<sysfs::PciAddress, const FunctionUnits*> unitsByAddress;
    if (units != nullptr) {
      for (const FunctionUnits& function : units->functions) {
        unitsByAddress[function.address] = &function;
      }
    }
    out_.BeginObject();
    const std::vector<const sysfs::PciFunction*> gpus = scan.Gpus();
    out_.Key("devices");
    out_.BeginArray();
    for (const sysfs::PciFunction* function : gpus) {
      const auto found = unitsByAddress.find(function->address);
      Device(*function, found == unitsByAddress.end() ? nullptr : found->second);
    }
    out_.EndArray();
    if (units != nullptr) {
      out_.Key("resourceNames");
      out_.BeginArray();
      for (const std::string& name : units->resourceNames) {
        out_.String(name);
      }
      out_.EndArray();
    }
    // Stale counts say so, and since when: a reader tells them from fresh ones.
    if (stale != nullptr) {
      out_.Key(api::kStaleUnitsField);
      out_.BeginObject();
      Field("kubelet", stale->kubelet);
      Field("since", stale->since);
      out_.EndObject();
    }
    // Totals for kubectl's printer columns, which cannot count.
    out_.Key("summary");
    out_.BeginObject();
    int64_t healthy = 0;
    if (units != nullptr) {
      int64_t allocatable = 0;
      int64_t allocated = 0;
      for (const FunctionUnits& function : units->functions) {
        healthy += function.health == Health::kHealthy ? 1 : 0;
        allocatable += function.allocatable;
        allocated += function.allocated;
      }
      Field("allocatable", allocatable);
      Field("allocated", allocated);
    }
    Field("gpus", gpus.size());
    if (units != nullptr) {
      Field("healthy", healthy);
    }
    out_.EndObject();
    if (units != nullptr) {
      out_.Key("unplaced");
      out_.BeginArray();
      for (const UnplacedUnits& entry : units->unplaced) {
        out_.BeginObject();
        Field("allocatable", entry.allocatable);
        Field("allocated", entry.allocated);
        Field("resourceName", entry.resourceName);
        out_.EndObject();
      }
      out_.EndArray();
    }
    out_.EndObject();
  }

  void GpuNode(const std::string& nodeName, const sysfs::HostScan& scan, const UnitReport* units,
               const StaleUnits* stale) {
    out_.BeginObject();
    Field("apiVersion", api::kApiVersion);
    Field("kind", api::kGpuNodeKind);
    out_.Key("metadata");
    out_.BeginObject();
    Field("name", nodeName);
    out_.EndObject();
    out_.Key("status");
    Status(scan, units, stale);
    out_.EndObject();
  }

  // The keys of a device that are lists or objects of their own.
  void MdevTypes(const std::vector<sysfs::MdevType>& types) {
    if (types.empty()) return;
    out_.Key("mdevTypes");
    out_.BeginArray();
    for (const sysfs::MdevType& type : types) {
      out_.BeginObject();
      if (type.availableInstances) {
        Field("availableInstances", *type.availableInstances);
      }
      if (type.maxInstances) {
        Field("maxInstances", *type.maxInstances);
      }
      if (!type.name.empty()) {
        Field("name", type.name);
      }
      Field("type", type.type);
      out_.EndObject();
    }
    out_.EndArray();
  }

  void Mdevs(const std::vector<sysfs::Mdev>& mdevs) {
    if (mdevs.empty()) return;
    out_.Key("mdevs");
    out_.BeginArray();
    for (const sysfs::Mdev& mdev : mdevs) {
      out_.BeginObject();
      if (mdev.type) {
        Field("type", *mdev.type);
      }
      Field("uuid", mdev.uuid);
      out_.EndObject();
    }
    out_.EndArray();
  }

  void Vgpu(const sysfs::NvidiaVgpu& vgpu) {
    out_.Key("vgpu");
    out_.BeginObject();
    out_.Key("creatableTypes");
    out_.BeginArray();
    for (const sysfs::VgpuTypeEntry& type : vgpu.creatableTypes) {
      out_.BeginObject();
      Field("id", type.id);
      Field("name", type.name);
      out_.EndObject();
    }
    out_.EndArray();
    if (vgpu.currentType) {
      Field("currentType", *vgpu.currentType);
    }
    out_.EndObject();
  }

 private:
  void Field(std::string_view key, std::string_view value) {
    out_.Key(key);
    out_.String(value);
  }
  void Field(std::string_view key, const std::string& value) {
    Field(key, std::string_view(value));
  }
  void Field(std::string_view key, const char* value) { Field(key, std::string_view(value)); }
  void Field(std::string_view key, bool value) {
    out_.Key(key);
    out_.Bool(value);
  }
  template <typename Integer, typename = std::enable_if_t<std::is_integral_v<Integer>>>
  void Field(std::string_view key, Integer value) {
    out_.Key(key);
    out_.Number(value);
  }

  Sink& out_;
};

}  // namespace

nlohmann::json BuildDeviceStatus(const sysfs::PciFunction& function, const FunctionUnits* units) {
  JsonBuilder out;
  StatusWriter<JsonBuilder>(out).Device(function, units);
  return out.Take();
}

nlohmann::json BuildStatus(const sysfs::HostScan& scan, const UnitReport* units,
                           const StaleUnits* stale) {
  JsonBuilder out;
  StatusWriter<JsonBuilder>(out).Status(scan, units, stale);
  return out.Take();
}

nlohmann::json BuildGpuNode(const std::string& nodeName, nlohmann::json status) {
  return {{"apiVersion", api::kApiVersion},
          {"kind", api::kGpuNodeKind},
          {"metadata", {{"name", nodeName}}},
          {"status", std::move(status)}};
}

std::string RenderGpuNodeJson(const std::string& nodeName, const sysfs::HostScan& scan,
                              const UnitReport* units, const StaleUnits* stale) {
  std::string text;
  text.reserve(2048 + 1280 * scan.functions.size());  // about what a GPU function takes
  JsonPrinter out(text);
  StatusWriter<JsonPrinter>(out).GpuNode(nodeName, scan, units, stale);
  text += '\n';
  return text;
}

void PrintGpuNodeJson(const std::function<void(std::string_view)>& write,
                      const std::string& nodeName, const sysfs::HostScan& scan,
                      const UnitReport* units, const StaleUnits* stale) {
  constexpr size_t kPiece = 64 * 1024;
  std::string text;
  text.reserve(kPiece + 4096);  // a piece and the object that closes past it
  JsonPrinter out(text, write, kPiece);
  StatusWriter<JsonPrinter>(out).GpuNode(nodeName, scan, units, stale);
  text += '\n';
  write(text);
}

}  // namespace cozy::agent
