#include "api/keys.h"

namespace cozy::api {

std::string ClassBudgetKey(std::string_view className) {
  std::string key(kBudgetKeyPrefix);
  key += className;
  return key;
}

std::string RawQuotaKey(std::string_view resourceName) {
  std::string key(kRawQuotaKeyPrefix);
  key += resourceName;
  return key;
}

}  // namespace cozy::api
