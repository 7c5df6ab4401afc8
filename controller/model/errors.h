// The one error the model raises: the snapshot holds something it cannot read (a budget that
// is not a quantity, a GPU request that is not one). Every caller fails on it rather than
// skipping the object, so no check passes on what it could not read.
#pragma once

#include <stdexcept>
#include <string>

namespace cozy::model {

class InvalidSnapshot : public std::runtime_error {
 public:
  // object: "ResourceQuota tenant-a/gpu"; field: "spec.hard[\"requests.gpu.cozystack.io/a\"]".
  InvalidSnapshot(std::string object, std::string field, const std::string& problem)
      : std::runtime_error(object + ": " + field + ": " + problem),
        object_(std::move(object)),
        field_(std::move(field)) {}
  const std::string& object() const { return object_; }
  const std::string& field() const { return field_; }

 private:
  std::string object_;
  std::string field_;
};

}  // namespace cozy::model
