// Name rules of api/validation.h. The CRD test checks that the CRDs judge the same tables the
// same way, so the API server and the offline model agree.
#include <gtest/gtest.h>

#include "api/validation.h"
#include "test/controller/name_cases.h"

namespace cozy::api {
namespace {

// B4: "a class name is a DNS label other than total because it becomes part of a quota key"
TEST(ClassNameB4, DnsLabelOtherThanTotal) {
  for (const NameCase& c : ClassNameCases()) {
    EXPECT_EQ(CheckClassName(c.name).empty(), c.valid) << "class name \"" << c.name << "\"";
  }
}

TEST(ClassNameB4, ErrorSaysWhy) {
  EXPECT_NE(CheckClassName("total").find("reserved"), std::string::npos);
  EXPECT_NE(CheckClassName("A100").find("lower-case"), std::string::npos);
}

// B8: "A class resource name must be a valid extended resource outside gpu.cozystack.io, where
// it would read as a GPU budget key."
TEST(ClassResourceNameB8, ExtendedResourceOutsideOwnGroup) {
  for (const NameCase& c : ResourceNameCases()) {
    EXPECT_EQ(CheckClassResourceName(c.name).empty(), c.valid) << "resource \"" << c.name << "\"";
  }
}

TEST(DnsSubdomain, LabelsAndLength) {
  EXPECT_TRUE(CheckDnsSubdomain("vm-1.tenant-a").empty());
  EXPECT_FALSE(CheckDnsSubdomain("vm..1").empty());
  EXPECT_FALSE(CheckDnsSubdomain(std::string(254, 'a')).empty());
  EXPECT_TRUE(CheckDnsSubdomain(std::string(63, 'a') + "." + std::string(63, 'b')).empty());
}

}  // namespace
}  // namespace cozy::api
