#!/usr/bin/env bash
# Builds the container images the node e2e tests import into containerd, with buildah and without
# pulling anything (no container registry is reachable from the test machines):
# `selkie` mode (Selkie's images, and the tests' workload):
#   selkie-base              localhost/selkie-base:debian12: a distroless-cc-like runtime made from
#                            this machine's Debian files: the shared libraries the three binaries
#                            need (ldd) and the dynamic loader, Debian's CA bundle, /etc/passwd and
#                            /etc/group (root, nobody, nonroot 65532), nsswitch.conf, os-release,
#                            /tmp (1777), /home/nonroot; USER 65532:65532
#   selkie-concierge         localhost/selkie-concierge:TAG and localhost/selkie-supervisor:TAG: the
#   selkie-supervisor        Containerfile's targets with BINARIES=prebuilt and BASE=selkie-base;
#                            TAG = the first 12 hex of sha256 over the three binaries (a new build
#                            gives a new tag), or $SELKIE_IMAGE_TAG
#   selkie-workload          localhost/selkie-workload:1: Debian's busybox-static as /bin/busybox
#                            with a /bin link per applet, CMD ["sh"] (exec/attach/port-forward/logs)
# `node` mode (the node's own images, e2e/src/node.rs):
#   pause                    registry.k8s.io/pause:<pause.version>: the static /pause, USER 65535
#   kube-controller-manager  registry.k8s.io/kube-controller-manager:v<its --version>: the static
#                            binary in /usr/local/bin (on PATH) and the CA bundle
#   coredns                  registry.k8s.io/coredns/coredns:v<its -version>: the static /coredns
#                            (ENTRYPOINT) and the CA bundle
#
# usage: build-images.sh selkie <binaries-dir> <out-dir>
#        build-images.sh node <kubernetes-node-dir> <coredns-dir> <out-dir>
#   <binaries-dir>    holds selkie-concierge, selkie-kube-cert-agent, selkie-supervisor
#                     (cargo build --release: target/release)
#   <kubernetes-node-dir>  holds pause, pause.version and kube-controller-manager, and
#   <coredns-dir>     holds coredns: the dirs `build-components.sh node` prints
#   SELKIE_IMAGE_TAG  (optional) forces the Concierge's and Supervisor's tag
#   SELKIE_BUILDAH_DRIVER (optional) buildah's storage driver, default vfs (works on any file
#                     system, leaves no mounts behind)
# Writes <out-dir>/<name>.tar, a docker-archive holding one image with its reference in
# manifest.json's RepoTags (so `ctr -n k8s.io images import` names it), and <name>.tar.stamp, the
# reference and a hash of the image's inputs (files, this script, the Containerfile): an image
# whose tar and stamp match is not rebuilt. buildah's storage is <out-dir>/.buildah; the host's
# default storage is left alone. Runs on one out-dir serialise on a lock. stdout: one line per
# image, `<name>=<tar path> <image reference>`; progress and errors go to stderr. Any missing
# input or failed step ends the run non-zero with the reason. Needs root (or rootless buildah),
# buildah and runc (the Concierge and Supervisor images are smoke-tested with `buildah run`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONTAINERFILE="$here/../../Containerfile"
BASE_REF=localhost/selkie-base:debian12
WORKLOAD_REF=localhost/selkie-workload:1
BUSYBOX=/bin/busybox

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { printf '[build-images] error: %s\n' "$*" >&2; exit 1; }

usage="usage: build-images.sh selkie <binaries-dir> <out-dir> | node <kubernetes-node-dir> <coredns-dir> <out-dir>"
MODE=${1:-}
case "$MODE" in
  selkie)
    (($# == 3)) || die "$usage"
    [[ -d $2 ]] || die "binaries dir $2 does not exist (build it: cargo build --release --locked -p selkie-concierge -p selkie-supervisor)"
    BIN_DIR=$(cd "$2" && pwd)
    OUT_ARG=$3
    APPS=("$BIN_DIR"/selkie-concierge "$BIN_DIR"/selkie-kube-cert-agent "$BIN_DIR"/selkie-supervisor)
    STATIC=("$BUSYBOX")
    for f in "${APPS[@]}"; do [[ -x $f ]] || die "$f is missing or not executable"; done
    [[ -x $BUSYBOX ]] || die "$BUSYBOX is missing: install Debian's busybox-static (e2e/scripts/setup.sh does)"
    ;;
  node)
    (($# == 4)) || die "$usage"
    NODE_BIN=$2 COREDNS=$3/coredns OUT_ARG=$4
    STATIC=("$NODE_BIN"/pause "$NODE_BIN"/kube-controller-manager "$COREDNS")
    for f in "${STATIC[@]}"; do [[ -x $f ]] || die "$f is missing or not executable"; done
    [[ -s $NODE_BIN/pause.version ]] || die "$NODE_BIN/pause.version is missing or empty"
    ;;
  *) die "$usage" ;;
esac
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || die "/etc/ssl/certs/ca-certificates.crt is missing: install ca-certificates"
command -v buildah >/dev/null || die "buildah is not on PATH: apt-get install buildah"
for f in "${STATIC[@]}"; do
  [[ $(ldd "$f" 2>&1 || true) =~ not\ a\ dynamic\ executable|statically\ linked ]] \
    || die "$f is dynamically linked; its image has no libraries, so it must be static"
done

mkdir -p "$OUT_ARG"
OUT=$(cd "$OUT_ARG" && pwd)
exec {lock}>"$OUT/.lock"
flock "$lock"
DRIVER=${SELKIE_BUILDAH_DRIVER:-vfs}
bah() { buildah --root "$OUT/.buildah/$DRIVER" --runroot "$OUT/.buildah/run-$DRIVER" --storage-driver "$DRIVER" "$@"; }

# Hashes: of file contents (names do not matter), and of the recipe (any edit rebuilds everything).
sum() { cat "$@" | sha256sum | cut -c1-16; }
RECIPE=$(sum "${BASH_SOURCE[0]}" "$CONTAINERFILE")

# The libraries the binaries load, at the paths ldd resolves them to (the loader at its own path).
LIBS=()
for app in "${APPS[@]+"${APPS[@]}"}"; do
  deps=$(ldd "$app") || die "ldd $app failed"
  grep -q 'not found' <<<"$deps" && die "$app needs a library this machine lacks: $(grep 'not found' <<<"$deps")"
  while read -r lib; do LIBS+=("$lib"); done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$deps")
done
mapfile -t LIBS < <(printf '%s\n' "${LIBS[@]}" | sort -u)

# stage_etc ROOT: the files every image here shares: users, groups, name services, /tmp, /root.
stage_etc() {
  mkdir -p "$1/etc" "$1/tmp" "$1/root" && chmod 1777 "$1/tmp" && chmod 700 "$1/root"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$1/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$1/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' 'networks: files' \
    'protocols: files' 'services: files' 'ethers: files' 'rpc: files' >"$1/etc/nsswitch.conf"
}
stage_certs() { mkdir -p "$1/etc/ssl/certs" && cp -L /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/"; }

# from_rootfs REF HASH ROOT CONFIG...: commits ROOT (owned by root; /home/nonroot, if present, by
# 65532) as the single layer of REF, with `buildah config` CONFIG; reproducible (timestamps 0).
from_rootfs() {
  local ref=$1 hash=$2 root=$3 c; shift 3
  tar -C "$root" --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 --exclude=./home/nonroot -cf "$root.tar" .
  [[ ! -d $root/home/nonroot ]] || tar -C "$root" --mtime=@0 --numeric-owner --owner=65532 --group=65532 -rf "$root.tar" ./home/nonroot
  c=$(bah from --pull=never scratch)
  bah add --quiet "$c" "$root.tar" / >/dev/null
  bah config --label "selkie.inputs=$hash" "$@" "$c" >&2
  bah commit --quiet --format oci --timestamp 0 --rm "$c" "$ref" >/dev/null
  rm -rf "$root" "$root.tar"
}
newroot() { mktemp -d "$OUT/.rootfs.XXXXXX"; }

build_base() {
  local root lib; root=$(newroot)
  stage_etc "$root"; stage_certs "$root"; mkdir -p "$root/home/nonroot"
  for lib in "${LIBS[@]}"; do mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"; done
  cp -L /etc/os-release "$root/etc/os-release"
  from_rootfs "$1" "$2" "$root" --env PATH=/usr/local/bin:/usr/bin:/bin --user 65532:65532 --workingdir /home/nonroot
}
build_pause() {
  local root; root=$(newroot)
  install -m 0755 "$NODE_BIN/pause" "$root/pause"
  from_rootfs "$1" "$2" "$root" --entrypoint '["/pause"]' --user 65535:65535
}
build_kcm() {
  local root; root=$(newroot)
  stage_certs "$root"; mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  install -D -m 0755 "$NODE_BIN/kube-controller-manager" "$root/usr/local/bin/kube-controller-manager"
  from_rootfs "$1" "$2" "$root" --env PATH=/usr/local/bin:/usr/bin:/bin
}
build_coredns() {
  local root; root=$(newroot)
  stage_certs "$root"; mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  install -m 0755 "$COREDNS" "$root/coredns"
  from_rootfs "$1" "$2" "$root" --entrypoint '["/coredns"]'
}
build_workload() {
  local root applet; root=$(newroot)
  stage_etc "$root"; mkdir -p "$root/bin"
  install -m 0755 "$BUSYBOX" "$root/bin/busybox"
  for applet in $("$BUSYBOX" --list); do [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"; done
  from_rootfs "$1" "$2" "$root" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd '["sh"]'
}
# build_app TARGET REF HASH: the Containerfile's TARGET on selkie-base with the prebuilt binaries,
# then a smoke test: its binaries run in a container as the image's user (65532). Only an image that
# passes is tagged REF (so a failed one is never taken for built).
build_app() {
  local target=$1 ref=$2 hash=$3 ctx="$OUT/.context" c tmp=localhost/selkie-unverified:$1
  in_store "$BASE_REF" "$BASE_HASH" || build_base "$BASE_REF" "$BASE_HASH"
  # bin/supervisor-libs/: empty, the base has every library the binaries need (see above).
  rm -rf "$ctx" && mkdir -p "$ctx/bin/supervisor-libs"
  cp -l "${APPS[@]}" "$ctx/bin/" 2>/dev/null || cp "${APPS[@]}" "$ctx/bin/"
  bah build --quiet --format oci --timestamp 0 --pull=never --skip-unused-stages=true \
    -f "$CONTAINERFILE" --target "$target" --build-arg BINARIES=prebuilt --build-arg "BASE=$BASE_REF" \
    --label "selkie.inputs=$hash" -t "$tmp" "$ctx" >/dev/null
  rm -rf "$ctx"
  bah rm --all >/dev/null  # buildah 1.28 leaves the working container of a FROM-only stage behind
  c=$(bah from --pull=never "$tmp")
  if [[ $target == concierge ]]; then
    smoke "$ref" "$c" /usr/local/bin/selkie-concierge --help
    smoke "$ref" "$c" -e CERT_PATH=/etc/passwd -e KEY_PATH=/etc/group /usr/local/bin/selkie-kube-cert-agent print
  else
    smoke "$ref" "$c" /usr/local/bin/selkie-supervisor --help
  fi
  bah rm "$c" >/dev/null && bah tag "$tmp" "$ref" && bah rmi "$tmp" >/dev/null
}
# smoke REF CONTAINER [RUN-OPTION...] COMMAND...: runs COMMAND in CONTAINER; dies with its output.
smoke() {
  local ref=$1 c=$2 args=() out; shift 2
  while [[ $1 == -e ]]; do args+=("$1" "$2"); shift 2; done
  out=$(bah run --network none "${args[@]}" "$c" -- "$@" 2>&1) \
    || { printf '%s\n' "$out" >&2; bah rm "$c" >/dev/null; die "$ref: \`$*\` fails in the image (output above)"; }
}

in_store() { [[ "$(bah inspect --type image --format '{{index .OCIv1.Config.Labels "selkie.inputs"}}' "$1" 2>/dev/null)" == "$2" ]]; }

# image NAME REF HASH BUILD...: unless <name>.tar and its stamp match REF and HASH, builds REF with
# BUILD (unless the storage has it), writes the tar, checks its RepoTags, drops REF's old tags.
image() {
  local name=$1 ref=$2 hash=$3 tar="$OUT/$1.tar" old; shift 3
  if [[ -f $tar && "$(cat "$tar.stamp" 2>/dev/null)" == "$ref $hash" ]]; then
    log "$name: $ref is up to date"
  else
    local start=$SECONDS
    in_store "$ref" "$hash" || { log "$name: building $ref"; "$@" "$ref" "$hash"; }
    rm -f "$tar" "$tar.stamp" "$tar.tmp"
    bah push --quiet "$ref" "docker-archive:$tar.tmp:$ref" >&2
    tar -xOf "$tar.tmp" manifest.json | grep -qF "\"RepoTags\":[\"$ref\"]" \
      || die "$name: $tar.tmp's manifest.json does not name $ref"
    mv "$tar.tmp" "$tar" && printf '%s %s\n' "$ref" "$hash" >"$tar.stamp"
    for old in $(bah images --noheading --format '{{.Name}}:{{.Tag}}' --filter "reference=${ref%:*}"); do
      [[ $old == "$ref" ]] || bah rmi "$old" >/dev/null
    done
    bah rmi --prune >/dev/null
    log "$name: $ref -> $tar ($(du -m "$tar" | cut -f1) MB, $((SECONDS - start))s)"
  fi
  printf '%s=%s %s\n' "$name" "$tar" "$ref"
}

if [[ $MODE == selkie ]]; then
  APPS_SUM=$(cat "${APPS[@]}" | sha256sum | cut -c1-64)
  TAG=${SELKIE_IMAGE_TAG:-${APPS_SUM:0:12}}
  BASE_HASH=$(sum <(printf '%s\n' "$RECIPE" "${LIBS[@]}") "${LIBS[@]}" /etc/ssl/certs/ca-certificates.crt /etc/os-release)
  image selkie-base "$BASE_REF" "$BASE_HASH" build_base
  image concierge "localhost/selkie-concierge:$TAG" "$(sum <(echo "concierge $BASE_HASH $APPS_SUM"))" build_app concierge
  image supervisor "localhost/selkie-supervisor:$TAG" "$(sum <(echo "supervisor $BASE_HASH $APPS_SUM"))" build_app supervisor
  image workload "$WORKLOAD_REF" "$(sum <(echo "$RECIPE") "$BUSYBOX")" build_workload
else
  KCM_VERSION=$("$NODE_BIN/kube-controller-manager" --version | awk '{print $2}')
  [[ $KCM_VERSION == v[0-9]* ]] || die "cannot read kube-controller-manager's version from its --version: '$KCM_VERSION'"
  COREDNS_VERSION=$("$COREDNS" -version | sed -n 's/^CoreDNS-\([0-9][0-9.]*\)$/\1/p')
  [[ -n $COREDNS_VERSION ]] || die "cannot read CoreDNS's version from its -version"
  PAUSE_VERSION=$(tr -d '[:space:]' <"$NODE_BIN/pause.version")
  image pause "registry.k8s.io/pause:$PAUSE_VERSION" "$(sum <(echo "$RECIPE") "$NODE_BIN/pause")" build_pause
  image kube-controller-manager "registry.k8s.io/kube-controller-manager:$KCM_VERSION" \
    "$(sum <(echo "$RECIPE") "$NODE_BIN/kube-controller-manager" /etc/ssl/certs/ca-certificates.crt)" build_kcm
  image coredns "registry.k8s.io/coredns/coredns:v$COREDNS_VERSION" \
    "$(sum <(echo "$RECIPE") "$COREDNS" /etc/ssl/certs/ca-certificates.crt)" build_coredns
fi
