#!/usr/bin/env bash
# Installs the Debian (bookworm) packages cozy-gpu builds and tests with, the npm packages of
# the policy test, and builds the test control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler), its nodes (kubelet, cri-runtime, gpu-device-plugin)
# and clients (kubectl, helm) from the Go modules pinned under tools/ into a cache outside the
# checkout (scripts/cluster.sh build; docs/testing.md, "The real control plane").
#   scripts/install-deps.sh          # everything the build and the test suite need
#   scripts/install-deps.sh --demo   # the Debian packages of the build alone: what
#                                    # scripts/demo.sh installs before it builds (it builds the
#                                    # Go tools its mode needs itself); no test-only package, no
#                                    # npm, no Go tool (docs/testing.md, "The first command's time")
# The product's build uses Debian's packages only: nothing is vendored or downloaded at build time.
# Run as root (CI does); with sudo otherwise.
set -euo pipefail
demo=0
case "${1:-}" in
  --demo) demo=1 ;;
  "") ;;
  *)
    echo "usage: scripts/install-deps.sh [--demo]" >&2
    exit 2
    ;;
esac

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
  # the real nodes of scripts/cluster.sh (the demo's --real-cluster, the tests): ip finds the
  # node's address for kubelet
  iproute2
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

# What only the tests, the checks and the packaging use, never the demo's build or run: left out
# with --demo. (The build's configuration needs googletest: the fakes the demo runs are built
# beside the tests, in one configuration the tests reuse.)
tests_only=" clang clang-tidy clang-format libclang-rt-14-dev pciutils git dbus-daemon dbus-bin
  systemd prometheus jq libbenchmark-dev umockdev libumockdev-dev dpkg-dev lintian "

missing=()
for p in "${packages[@]}"; do
  [ "$demo" -eq 0 ] || [[ "$tests_only" != *[[:space:]]"$p"[[:space:]]* ]] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "$demo" -eq 0 ] || exit 0

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
