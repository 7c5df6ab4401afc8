// What the admission tests (admission_tests) share: the AdmissionReview payloads as the API
// server sends them, read from test/controller/testdata/admission, and a check on an optional
// refusal's text.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace cozy::admission::testing {

inline nlohmann::json ReadTestdata(const std::string& name) {
  const std::filesystem::path path =
      std::filesystem::path(COZY_SOURCE_DIR) / "test/controller/testdata/admission" / name;
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// Whether a refusal was given and says `part`.
inline bool Contains(const std::optional<std::string>& text, const std::string& part) {
  return text && text->find(part) != std::string::npos;
}

}  // namespace cozy::admission::testing
