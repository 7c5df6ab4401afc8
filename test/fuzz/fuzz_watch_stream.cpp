// Fuzz target for what the Kubernetes client parses from the network: a watch stream cut
// into JSON values at any byte boundary, and error answers (Status bodies, Retry-After); the
// skim of an event (kube::SkimEvent) never throws and stubs only what parses whole.
// The splitter must hand out the same values however the bytes are split, and never hold
// more than it was given; with a small cap it must fail at the same value however the bytes
// are split, and never hold more than the cap and one read. Parsing (frames, Status bodies,
// Retry-After) must never throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kube/errors.h"
#include "kube/json_stream.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

struct Split {
  std::vector<std::string> values;
  std::string error;
  bool operator==(const Split&) const = default;
};

Split SplitAll(std::string_view bytes, size_t chunk,
               size_t cap = cozy::kube::kDefaultMaxJsonBytes) {
  cozy::kube::JsonStreamSplitter splitter(cap);
  Split split;
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    splitter.Feed(bytes.substr(at, chunk));
    while (auto value = splitter.Next()) split.values.push_back(*value);
    Check(splitter.Pending() <= bytes.size());
    Check(splitter.Pending() <= cap + chunk);
  }
  split.error = splitter.Error();
  Check(splitter.Failed() == !split.error.empty());
  return split;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto whole = SplitAll(bytes, bytes.size() + 1);
  Check(SplitAll(bytes, 1) == whole);
  Check(SplitAll(bytes, 7) == whole);
  for (const auto& value : whole.values) {
    Check(value.front() == '{' || value.front() == '[');
    std::string error;
    const auto parsed = cozy::kube::ParseNetworkJson(value, error);
    // A skim never throws, and stubs only what parses whole as an event of that type.
    const auto skimmed =
        cozy::kube::SkimEvent(value, [](const std::vector<std::string>&, const std::string& key) {
          return key.find('/') != std::string::npos;
        });
    if (skimmed) {
      Check(error.empty() && parsed.is_object());
      Check(parsed.contains("type") && parsed["type"] == skimmed->type);
      Check(parsed.contains("object") && parsed["object"].is_object());
      const auto& metadata = parsed["object"].value("metadata", nlohmann::json::object());
      Check(metadata.is_object() &&
            metadata.value("name", nlohmann::json()) == skimmed->stub["metadata"]["name"]);
    }
  }
  auto capped = SplitAll(bytes, bytes.size() + 1, 16);
  Check(SplitAll(bytes, 1, 16) == capped);
  Check(SplitAll(bytes, 5, 16) == capped);
  for (const auto& value : capped.values) Check(value.size() <= 16);

  for (int code : {404, 409, 429, 503}) {
    auto error = cozy::kube::ErrorFromResponse(code, "application/json", bytes, bytes, "GET",
                                               "/api/v1/pods");
    Check(error.httpStatus() == code);
  }
  (void)cozy::kube::ParseRetryAfter(bytes);
  return 0;
}
