#include "controller/webhook/server.h"

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "kube/json_stream.h"
#include "runtime/duration.h"
#include "runtime/log.h"

namespace cozy::controller::webhook {
namespace {

using runtime::LogFields;

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

class Server::Certificates {
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
        "the webhooks' serving certificate expires soon: renew it (cert-manager renews 30 days "
        "ahead)",
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
class Server::ClientAuthority {
 public:
  explicit ClientAuthority(std::filesystem::path path) : path_(std::move(path)) {}

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
        runtime::LogInfo("webhook client CA loaded", LogFields{{"file", path_.string()}});
      } catch (const std::exception& error) {
        runtime::LogWarning("webhook client CA not reloaded; the previous one is used",
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
      throw std::runtime_error(path_.string() + ": no PEM certificate (--webhook-client-ca)");
    }
    return store;
  }

  const std::filesystem::path path_;
  std::mutex mutex_;
  std::optional<FileStamp> stamp_;
  std::shared_ptr<X509_STORE> current_;
};

struct Server::Tls {
  Certificates* certificates = nullptr;
  ClientAuthority* clientAuthority = nullptr;  // null: callers are not asked for a certificate
};

namespace {

constexpr const char* kTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

// OpenSSL's certificate callback: called on every handshake before the server's certificate
// is chosen (and before the client's is asked for), so the pair served and the CA a caller is
// verified against are whatever the files hold now.
int UseCurrentCertificate(SSL* ssl, void* arg) {
  auto* tls = static_cast<Server::Tls*>(arg);
  const std::shared_ptr<const CertificatePair> pair = tls->certificates->Current();
  if (!pair) return 0;
  tls->certificates->WarnIfExpiring();
  if (SSL_use_certificate(ssl, pair->leaf) != 1 || SSL_use_PrivateKey(ssl, pair->key) != 1 ||
      SSL_set1_chain(ssl, pair->chain) != 1) {
    return 0;
  }
  if (tls->clientAuthority) {
    const std::shared_ptr<X509_STORE> store = tls->clientAuthority->Current();
    if (!store || SSL_set1_verify_cert_store(ssl, store.get()) != 1) return 0;
  }
  return 1;
}

}  // namespace

std::chrono::milliseconds RequestTimeout(const std::string& parameter) {
  if (auto parsed = runtime::ParseDuration(parameter); parsed && parsed->count() > 0) {
    return *parsed;
  }
  return std::chrono::seconds(10);
}

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      certificates_(std::make_unique<Certificates>(options_.certDir)),
      tls_(std::make_unique<Tls>()) {
  tls_->certificates = certificates_.get();
  if (!options_.clientCaFile.empty()) {
    clientAuthority_ = std::make_unique<ClientAuthority>(options_.clientCaFile);
    tls_->clientAuthority = clientAuthority_.get();
  }
}

Server::~Server() { Stop(); }

void Server::Handle(const std::string& path, Handler handler) {
  handlers_[path] = std::move(handler);
}

std::optional<Server::WaitSlot> Server::TryWait() {
  size_t now = waiting_.load();
  do {
    if (now >= options_.maxWaiting) return std::nullopt;
  } while (!waiting_.compare_exchange_weak(now, now + 1));
  return WaitSlot(waiting_);
}

Server::Stats Server::stats() const {
  std::lock_guard lock(statsMutex_);
  Stats stats = stats_;
  std::tie(stats.certificateLoads, stats.certificateErrors) = certificates_->Counts();
  stats.certificateNotAfter = certificates_->NotAfter();
  return stats;
}

void Server::Start() {
  certificates_->LoadOrThrow();
  certificates_->WarnIfExpiring();
  if (clientAuthority_) clientAuthority_->LoadOrThrow();
  Tls* tls = tls_.get();
  server_ = std::make_unique<httplib::SSLServer>([tls](SSL_CTX& context) {
    SSL_CTX_set_min_proto_version(&context, TLS1_2_VERSION);
    // TLS 1.2: forward-secret AEAD suites only (no SHA-1 CBC); TLS 1.3's are all AEAD. No
    // session tickets or cache: every connection authenticates afresh, and no ticket key
    // lives for the process's life.
    if (SSL_CTX_set_cipher_list(&context, kTls12Ciphers) != 1) return false;
    SSL_CTX_set_options(&context,
                        SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET);
    SSL_CTX_set_session_cache_mode(&context, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(&context, 0);  // TLS 1.3 sends tickets after the handshake otherwise
    SSL_CTX_set_cert_cb(&context, UseCurrentCertificate, tls);
    if (tls->clientAuthority) {
      // No certificate, or one the CA did not sign: the handshake fails, nothing is read.
      SSL_CTX_set_verify(&context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    return true;
  });
  if (!server_->is_valid()) {
    throw std::runtime_error("webhook server: cannot set up TLS: " + OpenSslError());
  }
  const size_t threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options_.maxBodyBytes);
  server_->set_read_timeout(options_.readTimeout);
  server_->set_write_timeout(options_.readTimeout);
  server_->set_keep_alive_timeout(5);
  // Each answer is one small write: without TCP_NODELAY it waits on the API server's delayed
  // ACK, about 40 ms per admission call (docs/benchmarks.md, "Through the API server").
  server_->set_tcp_nodelay(true);
  for (const auto& [path, handler] : handlers_) {
    server_->Post(path, [this, path = path, handler = handler](const httplib::Request& request,
                                                               httplib::Response& response) {
      const auto received = std::chrono::steady_clock::now();
      {
        std::lock_guard lock(statsMutex_);
        ++stats_.requests;
        ++stats_.byPath[path];
      }
      auto fail = [&](int status, const std::string& why) {
        {
          std::lock_guard lock(statsMutex_);
          ++stats_.failures;
        }
        runtime::LogWarning(
            "admission request not answered",
            LogFields{{"path", path}, {"status", std::to_string(status)}, {"error", why}});
        response.status = status;
        response.set_content(path + ": " + why + "\n", "text/plain; charset=utf-8");
      };
      std::string parseError;
      const nlohmann::json review = kube::ParseNetworkJson(request.body, parseError);
      if (!parseError.empty()) {
        fail(400, "the body is not JSON: " + parseError);
        return;
      }
      // The API server stops waiting after `timeout`; the answer needs its way back.
      const auto timeout = RequestTimeout(request.get_param_value("timeout"));
      const auto margin =
          std::min<std::chrono::milliseconds>(timeout / 10, std::chrono::seconds(1));
      RequestContext context{received + timeout - margin};
      try {
        response.set_content(handler(review, context).dump(), "application/json");
      } catch (const std::exception& error) {
        fail(500, error.what());
      }
    });
  }
  std::string host = "0.0.0.0";
  int port = 0;
  const auto colon = options_.address.rfind(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no port");
    if (colon > 0) host = options_.address.substr(0, colon);
    size_t used = 0;
    const std::string portText = options_.address.substr(colon + 1);
    port = std::stoi(portText, &used);
    if (used != portText.size() || port < 0 || port > 65535) throw std::invalid_argument("port");
  } catch (const std::exception&) {
    throw std::runtime_error("--webhook-addr " + options_.address + ": not HOST:PORT or :PORT");
  }
  port_ =
      port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) {
    throw std::runtime_error("--webhook-addr " + options_.address + ": cannot listen");
  }
  serving_ = true;
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    serving_ = false;
  });
}

void Server::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  serving_ = false;
}

}  // namespace cozy::controller::webhook
