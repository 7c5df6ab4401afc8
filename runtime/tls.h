// TLS for runtime::HttpServer (docs/health-server.md, "POST routes and TLS"): the serving
// certificate and key are read from `tls.crt` and `tls.key` in a directory, as cert-manager and
// kubelet mount a Secret. They are looked at again on every handshake (a stat of each file,
// following kubelet's `..data` symlink swap) and re-read when either changed, so a renewed
// certificate is served from the next connection on, without a restart. A pair that does not load
// (a half-written file, a key that does not match) is logged and the last good pair stays in use.
//
// Callers: with `clientCaFile` set, only a client presenting a certificate that CA signed
// completes the handshake; anyone else is refused before a byte of a request is read. The CA
// file is looked at again on every handshake and re-read when it changed, like the pair.
//
// TLS 1.2 and 1.3 only; in 1.2 forward-secret AEAD suites only (no SHA-1 CBC); no session
// tickets or cache (every connection authenticates afresh, and no ticket key lives for the
// process's life). The served certificate's expiry is in stats() and logged as a warning in
// its last 7 days (cert-manager renews 30 days ahead, so that means renewal is stuck).
//
// Kept apart from cozy_runtime (library cozy_runtime_tls) so that the agent, which serves
// plain HTTP probes, does not link OpenSSL.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "runtime/http_server.h"

namespace cozy::runtime {

struct TlsOptions {
  std::filesystem::path certDir;             // holds tls.crt (the chain) and tls.key
  std::filesystem::path clientCaFile;        // PEM CA bundle callers' certificates must chain to;
                                             // empty: any client (no certificate asked for)
  std::string clientCaFlag = "--client-ca";  // named in errors about the CA file
};

class TlsTransport : public SecureTransport {
 public:
  explicit TlsTransport(TlsOptions options);
  ~TlsTransport() override;
  TlsTransport(const TlsTransport&) = delete;
  TlsTransport& operator=(const TlsTransport&) = delete;

  // Loads the pair (and the CA) now and sets up the context; throws naming the file and what
  // is wrong. Before the server starts.
  void LoadOrThrow();
  std::unique_ptr<SecureSession> Accept(int fd) override;

  struct Stats {
    int64_t certificateLoads = 0;
    int64_t certificateErrors = 0;
    int64_t certificateNotAfter = 0;  // the served certificate's expiry, Unix seconds
  };
  Stats stats() const;

  class Certificates;
  class ClientAuthority;
  struct Context;

 private:
  TlsOptions options_;
  std::unique_ptr<Certificates> certificates_;
  std::unique_ptr<ClientAuthority> clientAuthority_;
  std::unique_ptr<Context> context_;
};

}  // namespace cozy::runtime
