#include "kube/config.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace cozy::kube {
namespace fs = std::filesystem;

namespace {

std::string Trim(std::string text) {
  const char* space = " \t\r\n";
  auto first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  auto last = text.find_last_not_of(space);
  return text.substr(first, last - first + 1);
}

std::optional<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// Finds `name` in a kubeconfig list of {name, <field>} entries.
YAML::Node FindNamed(const YAML::Node& list, const std::string& name, const char* field) {
  if (list && list.IsSequence()) {
    for (const auto& entry : list) {
      if (entry["name"] && entry["name"].as<std::string>() == name) return entry[field];
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::string String(const YAML::Node& map, const char* key) {
  return map && map[key] ? map[key].as<std::string>() : std::string();
}

std::string Resolve(const fs::path& base, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (base / path).lexically_normal().string();
}

}  // namespace

std::string DecodeBase64(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    int v = value(c);
    if (v < 0) throw ConfigError(std::string("invalid base64 character '") + c + "'");
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xffu));
    }
  }
  return out;
}

ClientConfig LoadInClusterConfig(const InClusterPaths& paths) {
  std::string host = Env("KUBERNETES_SERVICE_HOST");
  std::string port = Env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    throw ConfigError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must "
        "be set (or pass --kubeconfig)");
  }
  ClientConfig config;
  // An IPv6 service address needs brackets in a URL, as net.JoinHostPort does.
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  config.server = "https://" + host + ":" + port;
  auto token = ReadFile(paths.tokenFile);
  if (!token || Trim(*token).empty()) {
    throw ConfigError("reading the service-account token " + paths.tokenFile.string() +
                      (token ? ": empty" : ": cannot open"));
  }
  config.tokenFile = paths.tokenFile.string();
  // A CA that cannot be read is not fatal in client-go: it falls back to the system roots.
  if (fs::exists(paths.caFile)) config.caFile = paths.caFile.string();
  std::string ns = Env("POD_NAMESPACE");
  if (ns.empty()) {
    if (auto text = ReadFile(paths.namespaceFile)) ns = Trim(*text);
  }
  config.namespace_ = ns.empty() ? "default" : ns;
  config.contextName = "in-cluster";
  return config;
}

ClientConfig LoadKubeconfig(const fs::path& file, const std::string& context) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const std::exception& e) {
    throw ConfigError("reading kubeconfig " + file.string() + ": " + e.what());
  }
  const std::string where = "kubeconfig " + file.string();
  try {
    std::string contextName = context.empty() ? String(root, "current-context") : context;
    if (contextName.empty()) throw ConfigError(where + ": no context given and no current-context");
    YAML::Node ctx = FindNamed(root["contexts"], contextName, "context");
    if (!ctx) throw ConfigError(where + ": context \"" + contextName + "\" not found");
    std::string clusterName = String(ctx, "cluster");
    YAML::Node cluster = FindNamed(root["clusters"], clusterName, "cluster");
    if (!cluster) {
      throw ConfigError(where + ": cluster \"" + clusterName + "\" of context \"" + contextName +
                        "\" not found");
    }
    std::string userName = String(ctx, "user");
    YAML::Node user = FindNamed(root["users"], userName, "user");
    if (!userName.empty() && !user) {
      throw ConfigError(where + ": user \"" + userName + "\" of context \"" + contextName +
                        "\" not found");
    }
    fs::path base = fs::absolute(file).parent_path();
    ClientConfig config;
    config.contextName = contextName;
    config.server = String(cluster, "server");
    if (config.server.empty()) {
      throw ConfigError(where + ": cluster \"" + clusterName + "\" has no server");
    }
    config.caFile = Resolve(base, String(cluster, "certificate-authority"));
    config.caData = DecodeBase64(String(cluster, "certificate-authority-data"));
    config.insecureSkipTlsVerify =
        cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>();
    if (user) {
      config.clientCertFile = Resolve(base, String(user, "client-certificate"));
      config.clientCertData = DecodeBase64(String(user, "client-certificate-data"));
      config.clientKeyFile = Resolve(base, String(user, "client-key"));
      config.clientKeyData = DecodeBase64(String(user, "client-key-data"));
      config.token = String(user, "token");
      config.tokenFile = Resolve(base, String(user, "tokenFile"));
      if (user["exec"] || user["auth-provider"]) {
        throw ConfigError(where + ": user \"" + userName +
                          "\" uses an exec or auth-provider plugin, which is not supported");
      }
    }
    std::string ns = String(ctx, "namespace");
    if (!ns.empty()) config.namespace_ = ns;
    return config;
  } catch (const YAML::Exception& e) {
    throw ConfigError(where + ": " + e.what());
  }
}

ClientConfig LoadConfig(const std::optional<fs::path>& kubeconfig) {
  if (kubeconfig && !kubeconfig->empty()) return LoadKubeconfig(*kubeconfig);
  return LoadInClusterConfig();
}

}  // namespace cozy::kube
