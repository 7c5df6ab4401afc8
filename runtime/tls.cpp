#include "runtime/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "runtime/log.h"

namespace cozy::runtime {
namespace {

std::string OpenSslError() {
  std::string text;
  while (unsigned long code = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof buffer);
    if (!text.empty()) text += "; ";
    text += buffer;
  }
  return text.empty() ? "unknown OpenSSL error" : text;
}

struct FileStamp {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  int64_t mtimeNs = 0;
  bool operator==(const FileStamp&) const = default;
};

// stat() follows symlinks: kubelet's swap of `..data` gives the names a new inode.
std::optional<FileStamp> Stamp(const std::filesystem::path& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return std::nullopt;
  return FileStamp{info.st_dev, info.st_ino, info.st_size,
                   int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec};
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

constexpr const char* kTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

}  // namespace

// One loaded pair: the leaf, the rest of the chain and the key.
struct CertificatePair {
  int64_t notAfter = 0;  // the leaf's expiry, Unix seconds
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;
  EVP_PKEY* key = nullptr;
  CertificatePair() = default;
  CertificatePair(const CertificatePair&) = delete;
  CertificatePair& operator=(const CertificatePair&) = delete;
  ~CertificatePair() {
    if (leaf) X509_free(leaf);
    if (chain) sk_X509_pop_free(chain, X509_free);
    if (key) EVP_PKEY_free(key);
  }
};

class TlsTransport::Certificates {
 public:
  explicit Certificates(std::filesystem::path dir)
      : certPath_(dir / "tls.crt"), keyPath_(dir / "tls.key") {}

  // Loads the pair now; throws naming the file and the problem.
  void LoadOrThrow() {
    std::lock_guard lock(mutex_);
    auto stamps = std::make_pair(Stamp(certPath_), Stamp(keyPath_));
    current_ = Load();
    stamps_ = stamps;
    ++loads_;
  }

  // The pair for a handshake: re-read when either file changed since the last look.
  std::shared_ptr<const CertificatePair> Current() {
    std::lock_guard lock(mutex_);
    auto stamps = std::make_pair(Stamp(certPath_), Stamp(keyPath_));
    if (stamps != stamps_ && stamps.first && stamps.second) {
      stamps_ = stamps;  // a pair that fails is not retried until the files change again
      try {
        current_ = Load();
        ++loads_;
        runtime::LogInfo("serving certificate loaded", LogFields{{"file", certPath_.string()}});
      } catch (const std::exception& error) {
        ++errors_;
        runtime::LogWarning("serving certificate not reloaded; the previous one is served",
                            LogFields{{"error", error.what()}});
      }
    }
    return current_;
  }

  std::pair<int64_t, int64_t> Counts() const {
    std::lock_guard lock(mutex_);
    return {loads_, errors_};
  }

  int64_t NotAfter() const {
    std::lock_guard lock(mutex_);
    return current_ ? current_->notAfter : 0;
  }

  // A warning while the served certificate is within kExpiryWarning of its end (or past it),
  // at most once an hour: cert-manager renews 30 days ahead, so this means renewal is stuck.
  void WarnIfExpiring() {
    std::lock_guard lock(mutex_);
    if (!current_ || current_->notAfter == 0) return;
    const auto now = std::chrono::system_clock::now();
    const auto left = std::chrono::seconds(current_->notAfter) - now.time_since_epoch();
    if (left > kExpiryWarning || now - lastWarning_ < std::chrono::hours(1)) return;
    lastWarning_ = now;
    runtime::LogWarning(
        "the serving certificate expires soon: renew it (cert-manager renews 30 days ahead)",
        LogFields{{"file", certPath_.string()},
                  {"hoursLeft",
                   std::to_string(std::chrono::duration_cast<std::chrono::hours>(left).count())}});
  }

  static constexpr std::chrono::hours kExpiryWarning{24 * 7};

 private:
  std::shared_ptr<const CertificatePair> Load() const {
    const std::string certText = ReadFile(certPath_);
    const std::string keyText = ReadFile(keyPath_);
    auto pair = std::make_shared<CertificatePair>();
    BIO* certBio = BIO_new_mem_buf(certText.data(), static_cast<int>(certText.size()));
    pair->leaf = PEM_read_bio_X509(certBio, nullptr, nullptr, nullptr);
    if (!pair->leaf) {
      BIO_free(certBio);
      throw std::runtime_error(certPath_.string() + ": no PEM certificate: " + OpenSslError());
    }
    pair->chain = sk_X509_new_null();
    while (X509* next = PEM_read_bio_X509(certBio, nullptr, nullptr, nullptr)) {
      sk_X509_push(pair->chain, next);
    }
    ERR_clear_error();  // the end of the file reads as an error
    BIO_free(certBio);
    BIO* keyBio = BIO_new_mem_buf(keyText.data(), static_cast<int>(keyText.size()));
    pair->key = PEM_read_bio_PrivateKey(keyBio, nullptr, nullptr, nullptr);
    BIO_free(keyBio);
    if (!pair->key) {
      throw std::runtime_error(keyPath_.string() + ": no PEM private key: " + OpenSslError());
    }
    if (X509_check_private_key(pair->leaf, pair->key) != 1) {
      ERR_clear_error();
      throw std::runtime_error(keyPath_.string() + ": the key does not match the certificate in " +
                               certPath_.string());
    }
    std::tm expiry{};
    if (ASN1_TIME_to_tm(X509_get0_notAfter(pair->leaf), &expiry) == 1) {
      pair->notAfter = static_cast<int64_t>(timegm(&expiry));
    }
    return pair;
  }

  const std::filesystem::path certPath_;
  const std::filesystem::path keyPath_;
  mutable std::mutex mutex_;
  std::pair<std::optional<FileStamp>, std::optional<FileStamp>> stamps_;
  std::shared_ptr<const CertificatePair> current_;
  int64_t loads_ = 0;
  int64_t errors_ = 0;
  std::chrono::system_clock::time_point lastWarning_{};
};

// The CA bundle a caller's certificate must chain to, as an OpenSSL store.
class TlsTransport::ClientAuthority {
 public:
  ClientAuthority(std::filesystem::path path, std::string flag)
      : path_(std::move(path)), flag_(std::move(flag)) {}

  void LoadOrThrow() {
    std::lock_guard lock(mutex_);
    const auto stamp = Stamp(path_);
    current_ = Load();
    stamp_ = stamp;
  }

  std::shared_ptr<X509_STORE> Current() {
    std::lock_guard lock(mutex_);
    const auto stamp = Stamp(path_);
    if (stamp && stamp != stamp_) {
      stamp_ = stamp;
      try {
        current_ = Load();
        runtime::LogInfo("client CA loaded", LogFields{{"file", path_.string()}});
      } catch (const std::exception& error) {
        runtime::LogWarning("client CA not reloaded; the previous one is used",
                            LogFields{{"error", error.what()}});
      }
    }
    return current_;
  }

 private:
  std::shared_ptr<X509_STORE> Load() const {
    const std::string text = ReadFile(path_);
    std::shared_ptr<X509_STORE> store(X509_STORE_new(), X509_STORE_free);
    BIO* bio = BIO_new_mem_buf(text.data(), static_cast<int>(text.size()));
    int loaded = 0;
    while (X509* certificate = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
      if (X509_STORE_add_cert(store.get(), certificate) == 1) ++loaded;
      X509_free(certificate);
    }
    ERR_clear_error();
    BIO_free(bio);
    if (loaded == 0) {
      throw std::runtime_error(path_.string() + ": no PEM certificate (" + flag_ + ")");
    }
    return store;
  }

  const std::filesystem::path path_;
  const std::string flag_;
  std::mutex mutex_;
  std::optional<FileStamp> stamp_;
  std::shared_ptr<X509_STORE> current_;
};

struct TlsTransport::Context {
  Certificates* certificates = nullptr;
  ClientAuthority* clientAuthority = nullptr;  // null: callers are not asked for a certificate
  SSL_CTX* ssl = nullptr;
  ~Context() {
    if (ssl) SSL_CTX_free(ssl);
  }
};

namespace {

// OpenSSL's certificate callback: called on every handshake before the server's certificate
// is chosen (and before the client's is asked for), so the pair served and the CA a caller is
// verified against are whatever the files hold now.
int UseCurrentCertificate(SSL* ssl, void* arg) {
  auto* context = static_cast<TlsTransport::Context*>(arg);
  const std::shared_ptr<const CertificatePair> pair = context->certificates->Current();
  if (!pair) return 0;
  context->certificates->WarnIfExpiring();
  if (SSL_use_certificate(ssl, pair->leaf) != 1 || SSL_use_PrivateKey(ssl, pair->key) != 1 ||
      SSL_set1_chain(ssl, pair->chain) != 1) {
    return 0;
  }
  if (context->clientAuthority) {
    const std::shared_ptr<X509_STORE> store = context->clientAuthority->Current();
    if (!store || SSL_set1_verify_cert_store(ssl, store.get()) != 1) return 0;
  }
  return 1;
}

// One connection's TLS over its non-blocking socket.
class TlsSession : public SecureSession {
 public:
  explicit TlsSession(SSL* ssl) : ssl_(ssl) {}
  ~TlsSession() override { SSL_free(ssl_); }
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  Io Handshake() override {
    ERR_clear_error();
    const int result = SSL_do_handshake(ssl_);
    return result == 1 ? Io::done : Outcome(result);
  }

  Io Read(char* buffer, size_t size, size_t& count) override {
    ERR_clear_error();
    const int result = SSL_read(ssl_, buffer, static_cast<int>(std::min<size_t>(size, INT_MAX)));
    if (result > 0) {
      count = static_cast<size_t>(result);
      return Io::done;
    }
    return Outcome(result);
  }

  Io Write(const char* data, size_t size, size_t& count) override {
    ERR_clear_error();
    const int result = SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(size, INT_MAX)));
    if (result > 0) {
      count = static_cast<size_t>(result);
      return Io::done;
    }
    return Outcome(result);
  }

  void Shutdown() override {
    ERR_clear_error();
    (void)SSL_shutdown(ssl_);
    ERR_clear_error();
  }

  std::string Error() override { return error_; }

  // Only asked for, and so only present, with a client CA; a handshake that is done has
  // verified it (SSL_VERIFY_FAIL_IF_NO_PEER_CERT), which the result says again.
  bool PeerVerified() override {
    return SSL_is_init_finished(ssl_) == 1 && SSL_get0_peer_certificate(ssl_) != nullptr &&
           SSL_get_verify_result(ssl_) == X509_V_OK;
  }

  bool ReceivedAny() override {
    const BIO* in = SSL_get_rbio(ssl_);
    return in != nullptr && BIO_number_read(const_cast<BIO*>(in)) > 0;
  }

 private:
  Io Outcome(int result) {
    switch (SSL_get_error(ssl_, result)) {
      case SSL_ERROR_WANT_READ:
        return Io::wantRead;
      case SSL_ERROR_WANT_WRITE:
        return Io::wantWrite;
      case SSL_ERROR_ZERO_RETURN:
        return Io::closed;
      default:
        error_ = OpenSslError();
        if (const long verify = SSL_get_verify_result(ssl_); verify != X509_V_OK) {
          error_ += std::string("; client certificate: ") + X509_verify_cert_error_string(verify);
        }
        return Io::failed;
    }
  }

  SSL* ssl_;
  std::string error_;
};

}  // namespace

TlsTransport::TlsTransport(TlsOptions options)
    : options_(std::move(options)),
      certificates_(std::make_unique<Certificates>(options_.certDir)),
      context_(std::make_unique<Context>()) {
  context_->certificates = certificates_.get();
  if (!options_.clientCaFile.empty()) {
    clientAuthority_ =
        std::make_unique<ClientAuthority>(options_.clientCaFile, options_.clientCaFlag);
    context_->clientAuthority = clientAuthority_.get();
  }
}

TlsTransport::~TlsTransport() = default;

void TlsTransport::LoadOrThrow() {
  certificates_->LoadOrThrow();
  certificates_->WarnIfExpiring();
  if (clientAuthority_) clientAuthority_->LoadOrThrow();
  if (context_->ssl) return;
  SSL_CTX* ssl = SSL_CTX_new(TLS_server_method());
  if (!ssl) throw std::runtime_error("cannot set up TLS: " + OpenSslError());
  context_->ssl = ssl;
  SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION);
  if (SSL_CTX_set_cipher_list(ssl, kTls12Ciphers) != 1) {
    throw std::runtime_error("cannot set up TLS ciphers: " + OpenSslError());
  }
  // A client that closes without close_notify has still ended its stream.
  SSL_CTX_set_options(ssl, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET |
                               SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_session_cache_mode(ssl, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ssl, 0);  // TLS 1.3 sends tickets after the handshake otherwise
  SSL_CTX_set_cert_cb(ssl, UseCurrentCertificate, context_.get());
  if (clientAuthority_) {
    // No certificate, or one the CA did not sign: the handshake fails, nothing is read.
    SSL_CTX_set_verify(ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
}

std::unique_ptr<SecureSession> TlsTransport::Accept(int fd) {
  if (!context_->ssl) return nullptr;
  SSL* ssl = SSL_new(context_->ssl);
  if (!ssl) {
    ERR_clear_error();
    return nullptr;
  }
  if (SSL_set_fd(ssl, fd) != 1) {
    ERR_clear_error();
    SSL_free(ssl);
    return nullptr;
  }
  SSL_set_accept_state(ssl);
  return std::make_unique<TlsSession>(ssl);
}

TlsTransport::Stats TlsTransport::stats() const {
  Stats stats;
  std::tie(stats.certificateLoads, stats.certificateErrors) = certificates_->Counts();
  stats.certificateNotAfter = certificates_->NotAfter();
  return stats;
}

}  // namespace cozy::runtime
