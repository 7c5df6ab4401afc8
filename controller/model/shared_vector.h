// A vector whose elements are shared, with the caches they came from and between copies, until
// one copy changes them (copy on write, at two levels). Copying a snapshot copies one pointer,
// not its 40,000 devices; and a snapshot made from the caches holds the caches' own immutable
// objects (Sharing), so reading the devices for a binder pass or for the webhooks' view after a
// device's change costs a pointer per device, not a deep copy of each (docs/controller.md, "What
// each webhook reads").
//
// Reading is a vector's: size, operator[], iteration, each yielding const T&. An element's
// address stays put for as long as any copy holds it, whatever else the vector does. Changing
// goes through the named mutators: the list is copied first while another copy shares it, and
// MutableAt copies the one element it hands out (the element may be a cache's, never to be
// written). There is no non-const operator[] or iterator on purpose.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

namespace cozy::model {

template <class T>
class SharedVector {
 public:
  using Item = std::shared_ptr<const T>;
  using value_type = T;
  using size_type = size_t;

  // Over the list's pointers, yielding the elements.
  class const_iterator {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = const T*;
    using reference = const T&;

    const_iterator() = default;
    explicit const_iterator(typename std::vector<Item>::const_iterator at) : at_(at) {}
    reference operator*() const { return **at_; }
    pointer operator->() const { return at_->get(); }
    reference operator[](difference_type n) const { return *at_[n]; }
    const_iterator& operator++() {
      ++at_;
      return *this;
    }
    const_iterator operator++(int) { return const_iterator(at_++); }
    const_iterator& operator--() {
      --at_;
      return *this;
    }
    const_iterator operator--(int) { return const_iterator(at_--); }
    const_iterator& operator+=(difference_type n) {
      at_ += n;
      return *this;
    }
    const_iterator& operator-=(difference_type n) {
      at_ -= n;
      return *this;
    }
    friend const_iterator operator+(const_iterator it, difference_type n) { return it += n; }
    friend const_iterator operator+(difference_type n, const_iterator it) { return it += n; }
    friend const_iterator operator-(const_iterator it, difference_type n) { return it -= n; }
    friend difference_type operator-(const const_iterator& a, const const_iterator& b) {
      return a.at_ - b.at_;
    }
    friend bool operator==(const const_iterator& a, const const_iterator& b) {
      return a.at_ == b.at_;
    }
    friend auto operator<=>(const const_iterator& a, const const_iterator& b) {
      return a.at_ <=> b.at_;
    }

   private:
    typename std::vector<Item>::const_iterator at_;
  };
  using iterator = const_iterator;

  SharedVector() = default;
  SharedVector(std::vector<T> items) {  // NOLINT(google-explicit-constructor): a vector's stand-in
    std::vector<Item> own;
    own.reserve(items.size());
    for (T& item : items) own.push_back(std::make_shared<const T>(std::move(item)));
    data_ = std::make_shared<std::vector<Item>>(std::move(own));
  }
  SharedVector(std::initializer_list<T> items) : SharedVector(std::vector<T>(items)) {}
  // A vector of these very elements (a cache's): none is copied. Null elements are left out.
  static SharedVector Sharing(std::vector<Item> items) {
    std::erase(items, nullptr);
    SharedVector shared;
    shared.data_ = std::make_shared<std::vector<Item>>(std::move(items));
    return shared;
  }

  const std::vector<Item>& Items() const {
    static const std::vector<Item> kEmpty;
    return data_ ? *data_ : kEmpty;
  }
  size_t size() const { return Items().size(); }
  bool empty() const { return Items().empty(); }
  const T& operator[](size_t i) const { return *Items()[i]; }
  const_iterator begin() const { return const_iterator(Items().begin()); }
  const_iterator end() const { return const_iterator(Items().end()); }
  const T& front() const { return *Items().front(); }
  const T& back() const { return *Items().back(); }
  // Whether `other` shares this one's list (a copy nobody changed since).
  bool SharesWith(const SharedVector& other) const { return data_ && data_ == other.data_; }
  // Whether `other` holds the very same elements, in the same order: its list, or another list
  // of the same objects (two lists Sharing one cache's objects). A pointer compare each.
  bool SameElements(const SharedVector& other) const {
    return SharesWith(other) || Items() == other.Items();
  }
  // The elements as plain values, copied.
  std::vector<T> Copy() const { return std::vector<T>(begin(), end()); }

  // Element `i`, this copy's own from now on: a copy of it each call, so a reference taken
  // before still reads the element as it was.
  T& MutableAt(size_t i) {
    auto own = std::make_shared<T>(*Items()[i]);
    T& item = *own;
    List()[i] = std::move(own);
    return item;
  }
  void push_back(T item) { List().push_back(std::make_shared<const T>(std::move(item))); }
  void push_back(Item item) {
    if (item) List().push_back(std::move(item));
  }
  // The new element, to fill in before the vector is copied.
  template <class... Args>
  T& emplace_back(Args&&... args) {
    auto own = std::make_shared<T>(std::forward<Args>(args)...);
    T& item = *own;
    List().push_back(std::move(own));
    return item;
  }
  template <class Predicate>
  size_t EraseIf(Predicate predicate) {
    return std::erase_if(List(), [&predicate](const Item& item) { return predicate(*item); });
  }
  void EraseAt(size_t i) { List().erase(List().begin() + static_cast<std::ptrdiff_t>(i)); }
  void reserve(size_t count) { List().reserve(count); }
  void clear() { data_.reset(); }

  bool operator==(const SharedVector& other) const {
    return std::equal(begin(), end(), other.begin(), other.end());
  }

 private:
  // The list to change, this copy's own from now on.
  std::vector<Item>& List() {
    if (!data_) {
      data_ = std::make_shared<std::vector<Item>>();
    } else if (data_.use_count() > 1) {
      data_ = std::make_shared<std::vector<Item>>(*data_);
    }
    return *data_;
  }

  std::shared_ptr<std::vector<Item>> data_;
};

}  // namespace cozy::model
