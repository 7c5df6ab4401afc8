#include "test/support/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <stdexcept>

namespace cozy::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// Closes with a reset (SO_LINGER 0), as a connection a route dropped ends for the client.
void Reset(int fd) {
  linger option{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &option, sizeof option);
  ::close(fd);
}

}  // namespace

TcpProxy::TcpProxy(int targetPort) : targetPort_(targetPort) {
  listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = Loopback(0);
  socklen_t length = sizeof address;
  if (listenFd_ < 0 || ::bind(listenFd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listenFd_, 64) != 0 ||
      ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("TcpProxy: cannot listen on loopback");
  }
  port_ = ntohs(address.sin_port);
  wakeFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  const uint64_t one = 1;
  (void)::write(wakeFd_, &one, sizeof one);
  thread_.join();
  ::close(listenFd_);
  ::close(wakeFd_);
}

void TcpProxy::Cut() {
  cut_ = true;
  const uint64_t one = 1;
  (void)::write(wakeFd_, &one, sizeof one);
}

void TcpProxy::Restore() { cut_ = false; }

void TcpProxy::Run() {
  struct Pair {
    int client;
    int server;
  };
  std::vector<Pair> pairs;
  std::array<char, 65536> buffer{};
  while (!stopping_) {
    std::vector<pollfd> polls = {{wakeFd_, POLLIN, 0}, {listenFd_, POLLIN, 0}};
    for (const Pair& pair : pairs) {
      polls.push_back({pair.client, POLLIN, 0});
      polls.push_back({pair.server, POLLIN, 0});
    }
    if (::poll(polls.data(), polls.size(), 200) < 0) continue;
    if ((polls[0].revents & POLLIN) != 0) {
      uint64_t value = 0;
      (void)::read(wakeFd_, &value, sizeof value);
    }
    if (cut_) {
      for (const Pair& pair : pairs) {
        Reset(pair.client);
        Reset(pair.server);
      }
      pairs.clear();
    }
    if ((polls[1].revents & POLLIN) != 0) {
      const int client = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        if (cut_) {
          Reset(client);
        } else {
          const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          const sockaddr_in target = Loopback(targetPort_);
          if (server < 0 ||
              ::connect(server, reinterpret_cast<const sockaddr*>(&target), sizeof target) != 0) {
            Reset(client);
            if (server >= 0) ::close(server);
          } else {
            pairs.push_back({client, server});
            ++accepted_;
          }
        }
      }
    }
    if (cut_) continue;
    // Forward whatever is ready; a side that ends ends the pair.
    std::vector<Pair> kept;
    for (size_t i = 0; i < pairs.size() && 2 + 2 * i + 1 < polls.size(); ++i) {
      const Pair& pair = pairs[i];
      bool open = true;
      for (int side = 0; side < 2 && open; ++side) {
        const pollfd& p = polls[2 + 2 * i + static_cast<size_t>(side)];
        if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const int from = side == 0 ? pair.client : pair.server;
        const int to = side == 0 ? pair.server : pair.client;
        const ssize_t got = ::read(from, buffer.data(), buffer.size());
        if (got <= 0) {
          open = false;
          break;
        }
        ssize_t sent = 0;
        while (sent < got) {
          const ssize_t n =
              ::send(to, buffer.data() + sent, static_cast<size_t>(got - sent), MSG_NOSIGNAL);
          if (n <= 0) {
            open = false;
            break;
          }
          sent += n;
        }
      }
      if (open) {
        kept.push_back(pair);
      } else {
        ::close(pair.client);
        ::close(pair.server);
      }
    }
    // Pairs accepted in this round were not polled yet.
    for (size_t i = (polls.size() - 2) / 2; i < pairs.size(); ++i) kept.push_back(pairs[i]);
    pairs.swap(kept);
  }
  for (const Pair& pair : pairs) {
    ::close(pair.client);
    ::close(pair.server);
  }
}

}  // namespace cozy::testing
