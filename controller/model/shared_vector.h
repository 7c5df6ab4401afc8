// A vector shared between copies until one of them changes (copy on write): copying a snapshot
// copies a pointer, not its 40,000 devices, so the webhooks' view of a cache state that moved
// only in pods keeps the devices of the one before (issue 26 §1). Reading is a const
// std::vector's (a const reference converts implicitly); changing goes through the named
// mutators or Mutable(), which copy the elements first while another copy shares them. There is
// no non-const operator[] or iterator on purpose: a read through one would copy the elements,
// and pointers taken into them before would point into the copy another holds.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace cozy::model {

template <class T>
class SharedVector {
 public:
  using value_type = T;
  using size_type = size_t;
  using const_iterator = typename std::vector<T>::const_iterator;
  using iterator = const_iterator;

  SharedVector() = default;
  SharedVector(std::vector<T> items)  // NOLINT(google-explicit-constructor): a vector's stand-in
      : data_(std::make_shared<std::vector<T>>(std::move(items))) {}
  SharedVector(std::initializer_list<T> items) : SharedVector(std::vector<T>(items)) {}

  const std::vector<T>& Get() const {
    static const std::vector<T> kEmpty;
    return data_ ? *data_ : kEmpty;
  }
  operator const std::vector<T>&() const { return Get(); }  // NOLINT: a vector's stand-in
  size_t size() const { return Get().size(); }
  bool empty() const { return Get().empty(); }
  const T& operator[](size_t i) const { return Get()[i]; }
  const T* data() const { return Get().data(); }
  const_iterator begin() const { return Get().begin(); }
  const_iterator end() const { return Get().end(); }
  const T& front() const { return Get().front(); }
  const T& back() const { return Get().back(); }
  // Whether `other` shares this one's elements (a copy nobody changed since).
  bool SharesWith(const SharedVector& other) const { return data_ && data_ == other.data_; }

  // The elements to change, this copy's own from now on.
  std::vector<T>& Mutable() {
    if (!data_) {
      data_ = std::make_shared<std::vector<T>>();
    } else if (data_.use_count() > 1) {
      data_ = std::make_shared<std::vector<T>>(*data_);
    }
    return *data_;
  }
  void push_back(T item) { Mutable().push_back(std::move(item)); }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    return Mutable().emplace_back(std::forward<Args>(args)...);
  }
  void reserve(size_t count) { Mutable().reserve(count); }
  void clear() { data_.reset(); }

  bool operator==(const SharedVector& other) const { return Get() == other.Get(); }

 private:
  std::shared_ptr<std::vector<T>> data_;
};

}  // namespace cozy::model
