#!/usr/bin/env bash
# Builds the real components Selkie's tests run against, from their published Go modules:
#   kube-apiserver + kubectl  from k8s.io/kubernetes (staging modules replaced by their published tags)
#   etcd                      from go.etcd.io/etcd/server/v3
#   dex                       from github.com/dexidp/dex (the OIDC provider of the JWT tests)
#   keycloak                  org.keycloak:keycloak-quarkus-dist from Maven Central (an upstream
#                             with token revocation, which Dex lacks), run on a JDK >= 21 from
#                             /usr/lib/jvm (printed as keycloak_java_home)
#   helm                      from helm.sh/helm/v3 (renders conf/install/ from the chart in
#                             conf/helm/selkie/; the chart's e2e test installs it)
#   kubernetes-node           kubelet, kube-controller-manager, kube-scheduler, kube-proxy from the
#                             same k8s.io/kubernetes module as kube-apiserver, and the sandbox
#                             ("pause") binary from its build/pause/linux/pause.c (static, gcc)
#   containerd                containerd, containerd-shim-runc-v2 and ctr from
#                             github.com/containerd/containerd/v2 (the node's container runtime;
#                             runc itself is Debian's)
#   cni-plugins               bridge, host-local, loopback and portmap from
#                             github.com/containernetworking/plugins (the node's pod network)
#   coredns                   from github.com/coredns/coredns (the node's cluster DNS: pods resolve
#                             kubernetes.default.svc and other Services' names, as on any cluster)
#   oauth2-client             e2e/oauth2-client/ (this repository): a small client on
#                             golang.org/x/oauth2, the library the pinniped CLI uses, at the version
#                             its go.mod and go.sum pin; keyed by a hash of its sources
# Each build lives in a cache outside the repository, keyed by version:
#   ${SELKIE_CACHE_DIR:-~/.cache/selkie}/components/<name>-<version>/bin/
# A finished build is marked by a stamp file, so a second run only checks the stamp (seconds).
# Concurrent runs serialise on a lock file. Prints `<name>=<bin-dir>` and `<name>_version=<version>`
# per component on stdout; progress and errors go to stderr.
#
# usage: build-components.sh [kubernetes|etcd|dex|keycloak|helm|oauth2-client|all|
#                              kubernetes-node|containerd|cni-plugins|coredns|node]   (default: all)
# `node` builds the four node components (the e2e node tests and `make cluster-up NODE=1`).
set -euo pipefail

K8S_VERSION="${SELKIE_K8S_VERSION:-1.35.4}"
ETCD_VERSION="${SELKIE_ETCD_VERSION:-3.6.16}"
# Dex's module path lacks /v2, so its v2.x tags are not valid module versions: the pseudo-version
# of the v2.45.1 tag's commit (11d2eeb52b42, 2026-03-03) is the way to name that release.
DEX_VERSION="${SELKIE_DEX_VERSION:-0.0.0-20260303133905-11d2eeb52b42}"
KEYCLOAK_VERSION="${SELKIE_KEYCLOAK_VERSION:-26.4.7}"
HELM_VERSION="${SELKIE_HELM_VERSION:-3.22.0}"
CONTAINERD_VERSION="${SELKIE_CONTAINERD_VERSION:-2.4.2}"
CNI_PLUGINS_VERSION="${SELKIE_CNI_PLUGINS_VERSION:-1.10.0}"
COREDNS_VERSION="${SELKIE_COREDNS_VERSION:-1.15.0}"
CACHE_DIR="${SELKIE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/selkie}/components"
OAUTH2_CLIENT_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../oauth2-client" && pwd)"
# Bump when the recipe below changes, so cached builds made by an older recipe are rebuilt.
RECIPE=1

log() { printf '[build-components] %s\n' "$*" >&2; }
die() { printf '[build-components] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH; the components are built from Go modules (install Go 1.24+)"
mkdir -p "$CACHE_DIR"

# run_logged NAME DIR CMD...: runs CMD in DIR with output to DIR/build.log; on failure names the
# component and command and shows the tail of the log, then exits non-zero.
run_logged() {
  local name=$1 dir=$2; shift 2
  if ! (cd "$dir" && "$@") >>"$dir/build.log" 2>&1; then
    printf '[build-components] error: building %s failed: %s\n--- last 30 lines of %s ---\n' \
      "$name" "$*" "$dir/build.log" >&2
    tail -n 30 "$dir/build.log" >&2
    exit 1
  fi
}

# with_cache NAME VERSION BUILD_FN: runs BUILD_FN in a fresh work dir unless the stamp says this exact
# version and recipe are already built; publishes the result atomically.
with_cache() {
  local name=$1 version=$2 build_fn=$3
  local dest="$CACHE_DIR/$name-$version" stamp="$CACHE_DIR/$name-$version/.stamp"
  local want="name=$name version=$version recipe=$RECIPE"
  exec {lock}>"$CACHE_DIR/.$name-$version.lock"
  flock "$lock"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "$name $version: cached in $dest"
  else
    local work="$CACHE_DIR/.$name-$version.work"
    rm -rf "$work" && mkdir -p "$work"
    log "$name $version: building in $work (cold builds take minutes; log: $work/build.log)"
    local start=$SECONDS
    "$build_fn" "$work" "$version"
    printf '%s\n' "$want" >"$work/.stamp"
    local secs=$((SECONDS - start))
    printf 'build_seconds=%s\nbin_bytes=%s\n' "$secs" "$(du -sb "$work/bin" | cut -f1)" >"$work/build-stats"
    rm -rf "$dest" && mv "$work" "$dest"
    log "$name $version: built in ${secs}s, binaries $(du -sh "$dest/bin" | cut -f1)"
  fi
  flock -u "$lock"
  printf '%s=%s\n%s_version=%s\n' "$name" "$dest/bin" "$name" "$version"
}

# k8s_build_cmds WORK VERSION CMD...: a throwaway module requiring k8s.io/kubernetes@vVERSION whose
# tools.go imports k8s.io/kubernetes/cmd/<CMD> for each CMD; then `go build` of those commands
# into WORK/bin with the version stamped as the release build stamps it.
k8s_build_cmds() {
  local work=$1 version=$2 minor; shift 2
  minor=${version#1.}; minor=${minor%%.*}
  printf 'module local/selkie-k8s-tools\n\ngo 1.24\n' >"$work/go.mod"
  # The module proxy serves kubernetes' go.mod verbatim, replace lines included: every staging
  # module it maps to ./staging/src is replaced with its published v0.<minor>.<patch> tag.
  run_logged kubernetes "$work" sh -c "go mod download -json 'k8s.io/kubernetes@v$version' >download.json; rc=\$?; cat download.json; exit \$rc"
  local gomod
  gomod=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$work/download.json")
  [[ -f "$gomod" ]] || die "kubernetes v$version: the module proxy gave no go.mod (see $work/download.json)"
  local mods
  mods=$(sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/src/.*|\1|p' "$gomod")
  [[ -n "$mods" ]] || die "kubernetes v$version: no staging replace lines found in $gomod"
  local m
  for m in $mods; do
    run_logged kubernetes "$work" go mod edit "-replace=$m=$m@v0.${version#1.}"
  done
  run_logged kubernetes "$work" go mod edit "-require=k8s.io/kubernetes@v$version"
  local cmd pkgs=()
  { printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
    printf ')\n'
  } >"$work/tools.go"
  run_logged kubernetes "$work" go mod tidy
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  mkdir -p "$work/bin"
  run_logged kubernetes "$work" env CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o bin/ "${pkgs[@]}"
}

build_kubernetes() {
  k8s_build_cmds "$1" "$2" kube-apiserver kubectl
}

# The node's Kubernetes binaries, and the sandbox image's binary built as Kubernetes' own
# build/pause/Makefile builds it (static, -Os), with the version kubeadm pins (PauseVersion), which
# names the image: WORK/bin/pause and WORK/bin/pause.version.
build_kubernetes_node() {
  local work=$1 version=$2
  k8s_build_cmds "$work" "$version" kubelet kube-controller-manager kube-scheduler kube-proxy
  command -v gcc >/dev/null || die "gcc is not on PATH; the sandbox (pause) binary is C"
  local src pause_version
  src=$(cd "$work" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  pause_version=$(sed -n 's/^[[:space:]]*PauseVersion = "\(.*\)"/\1/p' "$src/cmd/kubeadm/app/constants/constants.go")
  [[ -n "$pause_version" ]] || die "kubernetes v$version: no PauseVersion in cmd/kubeadm/app/constants"
  run_logged kubernetes-node "$work" gcc -Os -Wall -Werror -static "-DVERSION=v$pause_version-selkie" \
    -o bin/pause "$src/build/pause/linux/pause.c"
  printf '%s\n' "$pause_version" >"$work/bin/pause.version"
}

# containerd's daemon, its runc shim and its CLI; without cgo, so the btrfs snapshotter (cgo only)
# is left out: the node uses overlayfs.
build_containerd() {
  local work=$1 version=$2 module=github.com/containerd/containerd/v2
  printf 'module local/selkie-containerd-tools\n\ngo 1.24\n' >"$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/containerd"\n\t_ "%s/cmd/containerd-shim-runc-v2"\n\t_ "%s/cmd/ctr"\n)\n' \
    "$module" "$module" "$module" >"$work/tools.go"
  run_logged containerd "$work" go get "$module@v$version"
  run_logged containerd "$work" go mod tidy
  mkdir -p "$work/bin"
  run_logged containerd "$work" env CGO_ENABLED=0 go build -trimpath -tags no_btrfs \
    -ldflags "-s -w -X $module/version.Version=v$version" -o bin/ \
    "$module/cmd/containerd" "$module/cmd/containerd-shim-runc-v2" "$module/cmd/ctr"
}

build_coredns() {
  build_go_binary coredns "$1" "github.com/coredns/coredns@v$2" github.com/coredns/coredns coredns
}

# The CNI plugins the node's bridge network uses.
build_cni_plugins() {
  local work=$1 version=$2 module=github.com/containernetworking/plugins p pkgs=()
  for p in main/bridge main/loopback ipam/host-local meta/portmap; do pkgs+=("$module/plugins/$p"); done
  printf 'module local/selkie-cni-tools\n\ngo 1.24\n' >"$work/go.mod"
  { printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for p in "${pkgs[@]}"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$work/tools.go"
  run_logged cni-plugins "$work" go get "$module@v$version"
  run_logged cni-plugins "$work" go mod tidy
  mkdir -p "$work/bin"
  run_logged cni-plugins "$work" env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/ "${pkgs[@]}"
}

# build_go_binary COMPONENT WORK MODULE@VERSION PACKAGE BINARY [LDFLAGS]: a throwaway tools module
# requiring MODULE@VERSION builds PACKAGE (without cgo) into WORK/bin/BINARY, with LDFLAGS (such
# as -X version stamps) added to the stripping flags.
build_go_binary() {
  local component=$1 work=$2 module=$3 package=$4 binary=$5 ldflags=${6:-}
  printf 'module local/selkie-%s-tools\n\ngo 1.24\n' "$component" >"$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$package" >"$work/tools.go"
  run_logged "$component" "$work" go get "$module"
  run_logged "$component" "$work" go mod tidy
  mkdir -p "$work/bin"
  run_logged "$component" "$work" env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w${ldflags:+ $ldflags}" -o "bin/$binary" "$package"
}

build_etcd() {
  build_go_binary etcd "$1" "go.etcd.io/etcd/server/v3@v$2" go.etcd.io/etcd/server/v3 etcd
}

# Dex's own `replace ./api/v2` is ignored for a dependency; the api/v2 v2.4.0 it requires is the
# same code. No cgo: the tests use Dex's in-memory storage, not sqlite.
build_dex() {
  build_go_binary dex "$1" "github.com/dexidp/dex@v$2" github.com/dexidp/dex/cmd/dex dex
}

# Helm stamps its version at link time (its Makefile does the same), so `helm version` names it.
build_helm() {
  build_go_binary helm "$1" "helm.sh/helm/v3@v$2" helm.sh/helm/v3/cmd/helm helm \
    "-X helm.sh/helm/v3/internal/version.version=v$2 -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
}

# Keycloak's server distribution, unpacked so that WORK/bin/kc.sh is its start script.
build_keycloak() {
  local work=$1 version=$2
  command -v mvn >/dev/null || die "mvn is not on PATH; Keycloak comes from Maven Central (install Maven)"
  run_logged keycloak "$work" mvn -q -B dependency:copy \
    "-Dartifact=org.keycloak:keycloak-quarkus-dist:$version:tar.gz" -DoutputDirectory=.
  run_logged keycloak "$work" tar xzf "keycloak-quarkus-dist-$version.tar.gz" --strip-components=1
  rm -f "$work/keycloak-quarkus-dist-$version.tar.gz"
  [[ -x "$work/bin/kc.sh" ]] || die "keycloak $version: the distribution has no bin/kc.sh"
}

# The e2e tests' golang.org/x/oauth2 client, from its sources in this repository: go.sum pins the
# library, -mod=readonly refuses any other version, and the module cache serves later builds
# offline.
build_oauth2_client() {
  local work=$1
  mkdir -p "$work/src" "$work/bin"
  cp "$OAUTH2_CLIENT_SRC/go.mod" "$OAUTH2_CLIENT_SRC/go.sum" "$OAUTH2_CLIENT_SRC"/*.go "$work/src/"
  run_logged oauth2-client "$work/src" env CGO_ENABLED=0 go build -mod=readonly -trimpath \
    -ldflags "-s -w" -o ../bin/selkie-oauth2-client .
}

# The oauth2-client's cache key: its sources' hash (so an edit, or another pinned library version,
# rebuilds it).
oauth2_client_version() {
  (cd "$OAUTH2_CLIENT_SRC" && cat go.mod go.sum *.go) | sha256sum | cut -c1-16
}

# Prints keycloak_java_home=<a JDK of version 21 or newer under /usr/lib/jvm> (Keycloak 26 needs it).
keycloak_java_home() {
  local jdk major
  for jdk in /usr/lib/jvm/*/; do
    [[ -x "$jdk/bin/java" && -f "$jdk/release" ]] || continue
    major=$(sed -n 's/^JAVA_VERSION="\([0-9]*\).*/\1/p' "$jdk/release")
    if [[ -n "$major" ]] && ((major >= 21)); then
      printf 'keycloak_java_home=%s\n' "${jdk%/}"
      return
    fi
  done
  die "no JDK 21 or newer under /usr/lib/jvm for Keycloak $KEYCLOAK_VERSION"
}

case "${1:-all}" in
  kubernetes) with_cache kubernetes "$K8S_VERSION" build_kubernetes ;;
  etcd) with_cache etcd "$ETCD_VERSION" build_etcd ;;
  dex) with_cache dex "$DEX_VERSION" build_dex ;;
  keycloak) with_cache keycloak "$KEYCLOAK_VERSION" build_keycloak; keycloak_java_home ;;
  helm) with_cache helm "$HELM_VERSION" build_helm ;;
  oauth2-client) with_cache oauth2-client "$(oauth2_client_version)" build_oauth2_client ;;
  all)
    with_cache etcd "$ETCD_VERSION" build_etcd
    with_cache kubernetes "$K8S_VERSION" build_kubernetes
    with_cache dex "$DEX_VERSION" build_dex
    with_cache keycloak "$KEYCLOAK_VERSION" build_keycloak
    keycloak_java_home
    with_cache helm "$HELM_VERSION" build_helm
    with_cache oauth2-client "$(oauth2_client_version)" build_oauth2_client
    ;;
  kubernetes-node) with_cache kubernetes-node "$K8S_VERSION" build_kubernetes_node ;;
  containerd) with_cache containerd "$CONTAINERD_VERSION" build_containerd ;;
  cni-plugins) with_cache cni-plugins "$CNI_PLUGINS_VERSION" build_cni_plugins ;;
  coredns) with_cache coredns "$COREDNS_VERSION" build_coredns ;;
  node)
    with_cache kubernetes-node "$K8S_VERSION" build_kubernetes_node
    with_cache containerd "$CONTAINERD_VERSION" build_containerd
    with_cache cni-plugins "$CNI_PLUGINS_VERSION" build_cni_plugins
    with_cache coredns "$COREDNS_VERSION" build_coredns
    ;;
  *) die "usage: $0 [kubernetes|etcd|dex|keycloak|helm|oauth2-client|all|kubernetes-node|containerd|cni-plugins|coredns|node]" ;;
esac
