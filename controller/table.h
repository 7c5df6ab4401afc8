// Aligned text tables for people: what `simulate -o table` and `kubectl gpu` print.
#pragma once

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

namespace cozy::controller {

// Columns padded to their widest cell, two spaces apart, trailing blanks cut.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const {
    std::vector<size_t> widths(rows_.front().size(), 0);
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) {
        widths[i] = std::max(widths[i], row[i].size());
      }
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) {
          line += std::string(widths[i] - row[i].size() + 2, ' ');
        }
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out << line << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

inline std::string Join(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const std::string& item : items) {
    text += (text.empty() ? "" : separator) + item;
  }
  return text;
}

}  // namespace cozy::controller
