// A thread's name as `top -H`, `ps -L`, perf and /proc/<pid>/task/<tid>/comm show it: a hoster
// (or a benchmark) can tell which of a daemon's threads spends the CPU.
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace cozy::runtime {

// Names the calling thread; Linux keeps the first 15 bytes.
inline void NameThisThread(std::string_view name) {
  const std::string kept(name.substr(0, 15));
  pthread_setname_np(pthread_self(), kept.c_str());
}

}  // namespace cozy::runtime
