#!/usr/bin/env bash
# Installs the Debian (bookworm) packages cozy-gpu builds and tests with, the npm packages of
# the policy test, and builds the test control plane (etcd, kube-apiserver,
# kube-controller-manager, kubectl, helm) from the Go modules pinned under tools/ into a cache
# outside the checkout (scripts/cluster.sh build; docs/testing.md, "The real control plane").
# The product's build uses Debian's packages only: nothing is vendored or downloaded at build time.
# Run as root (CI does); with sudo otherwise.
set -euo pipefail

packages=(
  # toolchain; ccache keeps compiled objects across build directories and CI runs
  build-essential cmake ninja-build pkg-config git ccache
  clang clang-tidy clang-format libclang-rt-14-dev
  # discovery: libpci + Debian's pci.ids; lspci is the test oracle
  libpci-dev pciutils pci.ids
  # device events (libudev) and systemd integration (busctl is systemd's)
  libudev-dev libsystemd-dev systemd
  # the D-Bus service: sdbus-c++ and its sdbus-c++-xml2cpp; dbus-daemon, dbus-send and setpriv
  # (util-linux) for its test
  libsdbus-c++-dev libsdbus-c++-bin dbus-daemon dbus-bin util-linux
  # kubelet pod-resources (gRPC over a unix socket)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # JSON / YAML / CLI / logging
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  # Kubernetes client; HTTP servers (health and metrics, the fake API server)
  libcurl4-openssl-dev libcpp-httplib-dev
  # base64 of admission patches (OpenSSL libcrypto)
  libssl-dev
  # the demo and the tests: openssl makes the webhooks' certificates, curl asks health endpoints
  openssl curl
  # the real-node tests read kubelet's device checkpoint (JSON)
  jq
  # promtool validates the metrics exposition in tests
  prometheus
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # real captured hosts and replayed device events
  umockdev libumockdev-dev
  # the .deb: cpack's dpkg-shlibdeps and dpkg-deb, and lintian to check the package
  dpkg-dev lintian
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# node and npm for the policy test: Debian's, unless the machine has them already (a node
# from elsewhere may bundle its own npm and conflict with Debian's npm package).
node_packages=()
command -v node >/dev/null || node_packages+=(nodejs)
command -v npm >/dev/null || node_packages+=(npm)
if [ ${#node_packages[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${node_packages[@]}"
fi
# npm packages of the policy test, pinned by test/kube/cel/package-lock.json.
cel_dir="$(dirname "$0")/../test/kube/cel"
if [ ! -d "$cel_dir/node_modules/@bufbuild/cel" ] || [ ! -d "$cel_dir/node_modules/yaml" ]; then
  npm ci --prefix "$cel_dir" --no-audit --no-fund --loglevel=error
fi

# The real control plane and its clients, from pinned Go modules (Go 1.26: the machines have it;
# an older Go of 1.21 or later fetches the toolchain go.mod names). Once per pin; a cache hit
# costs nothing.
if ! command -v go >/dev/null; then
  echo "install-deps: go is not installed; the test control plane and kubectl/helm are built" \
    "from Go modules (Go 1.21 or later, which fetches 1.26)" >&2
  exit 1
fi
"$(dirname "$0")/cluster.sh" build >/dev/null
