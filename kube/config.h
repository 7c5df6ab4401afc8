// Where the API server is and how to authenticate to it: in-cluster (service env, projected
// token, CA) or a kubeconfig file (bare-metal hosts), as client-go reads them (research §1).
#pragma once

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace cozy::kube {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ClientConfig {
  std::string server;  // https://host:port or http://127.0.0.1:port (tests)
  // Server verification: a CA file or its PEM text; neither means the system roots.
  std::string caFile;
  std::string caData;
  bool insecureSkipTlsVerify = false;
  // Client certificate authentication, each as a file or PEM text.
  std::string clientCertFile;
  std::string clientCertData;
  std::string clientKeyFile;
  std::string clientKeyData;
  // Bearer token: a fixed one, or a file re-read as client-go does (see TokenSource).
  std::string token;
  std::string tokenFile;
  std::string namespace_ = "default";
  std::string contextName;  // kubeconfig only; for messages
};

// Paths the in-cluster config reads; overridable so tests run outside a pod.
struct InClusterPaths {
  std::filesystem::path tokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::filesystem::path caFile = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::filesystem::path namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

// KUBERNETES_SERVICE_HOST/PORT and the service-account files. Throws ConfigError when not in a
// pod (env unset) or when the token cannot be read, as client-go fails its start.
ClientConfig LoadInClusterConfig(const InClusterPaths& paths = {});

// One kubeconfig file; `context` empty means current-context. Relative file paths count from
// the file's directory. Throws ConfigError naming the file and the entry at fault.
ClientConfig LoadKubeconfig(const std::filesystem::path& file, const std::string& context = "");

// A kubeconfig path if one is given, else in-cluster; the agent's and controller's rule.
ClientConfig LoadConfig(const std::optional<std::filesystem::path>& kubeconfig);

// base64 as kubeconfig's *-data fields carry it (standard alphabet, padding optional).
std::string DecodeBase64(const std::string& text);

}  // namespace cozy::kube
