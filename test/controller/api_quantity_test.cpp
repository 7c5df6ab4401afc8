// Quantities as budgets, pod requests and class memory are read (api/quantity.h).
#include <gtest/gtest.h>

#include "api/quantity.h"

namespace cozy::api {
namespace {

struct QuantityCase {
  const char* text;
  std::optional<int64_t> expected;  // nullopt: an error
};

// Names the case by its text in test output and in CTest's test names.
void PrintTo(const QuantityCase& c, std::ostream* out) { *out << '"' << c.text << '"'; }

class WholeQuantityTest : public testing::TestWithParam<QuantityCase> {};

TEST_P(WholeQuantityTest, RoundsUpToWholeUnits) {
  const QuantityCase& c = GetParam();
  const QuantityResult result = ParseWholeQuantity(c.text);
  EXPECT_EQ(result.value, c.expected) << c.text << ": " << result.error;
  if (!c.expected) {
    EXPECT_NE(result.error.find(c.text), std::string::npos) << "the error names the input";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, WholeQuantityTest,
    testing::Values(QuantityCase{"2", 2}, QuantityCase{"+3", 3}, QuantityCase{"0", 0},
                    QuantityCase{"2000m", 2}, QuantityCase{"1500m", 2}, QuantityCase{"1m", 1},
                    QuantityCase{"0.5", 1}, QuantityCase{"1k", 1000}, QuantityCase{"1Ki", 1024},
                    QuantityCase{"1.5Ki", 1536}, QuantityCase{"80Gi", 85899345920},
                    QuantityCase{"1e3", 1000}, QuantityCase{"5E-1", 1}, QuantityCase{"2M", 2000000},
                    QuantityCase{"1E", 1000000000000000000}, QuantityCase{"-1", std::nullopt},
                    QuantityCase{"", std::nullopt}, QuantityCase{"two", std::nullopt},
                    QuantityCase{"2x", std::nullopt}, QuantityCase{"2 ", std::nullopt},
                    QuantityCase{"9Ei", std::nullopt},
                    QuantityCase{"99999999999999999999", std::nullopt}));

}  // namespace
}  // namespace cozy::api
