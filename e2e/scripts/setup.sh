#!/usr/bin/env bash
# Installs everything Selkie's build, tests and demo need on a fresh machine, and does nothing
# (in about a second) on a machine that already has it:
#   * Debian packages: util-linux (setpriv), cmake (pingora's zlib-ng), pkg-config, g++ (libFuzzer,
#     which the fuzz targets link); libclang-dev, libxmlsec1-dev and libxml2-dev (samael, the
#     Supervisor's SAML signature checks); chromium, chromium-driver and tmux (the browser and the
#     terminal of the OIDC login tests, e2e/tests/e2e/cli_oidc.rs); slapd and ldap-utils (OpenLDAP,
#     the directory of the LDAP tests, run from a temporary directory by e2e/src/ldap.rs, not as a
#     system service); samba, samba-ad-dc and samba-ad-provision (the Active Directory domain
#     controller of the AD tests, provisioned into a temporary directory by e2e/src/samba.rs);
#     libfaketime (the wall clock a test moves for one component, e2e/src/clock.rs);
#   * Rust components: rustfmt, clippy;
#   * the real components, built from their Go modules into a cache outside the repository
#     (build-components.sh all: kube-apiserver, kubectl, etcd, Dex, helm; Keycloak; and the
#     golang.org/x/oauth2 client of e2e/oauth2-client/, the pinniped CLI's OAuth library, as its
#     go.sum pins it);
#   * openid-client from npm (e2e/rp/, exactly as its package-lock.json pins it), the outside
#     relying party of the Supervisor's e2e test, installed into the same cache.
# Go and Rust themselves come with the machine image; their absence is a clear error.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

command -v cargo >/dev/null || die "cargo is not on PATH: install Rust stable (rustup) first"
command -v go >/dev/null || die "go is not on PATH: install Go 1.24 or newer first"

missing=()
command -v setpriv >/dev/null || missing+=(util-linux)
command -v cmake >/dev/null || missing+=(cmake)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v c++ >/dev/null || missing+=(g++)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v tmux >/dev/null || missing+=(tmux)
command -v slapd >/dev/null || missing+=(slapd)
command -v ldapadd >/dev/null || missing+=(ldap-utils)
command -v samba >/dev/null || missing+=(samba samba-ad-dc)
[[ -d /usr/share/samba/setup/ad-schema ]] || missing+=(samba-ad-provision)
command -v samba-tool >/dev/null || missing+=(samba-common-bin)
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]] || missing+=(libfaketime)
# samael (the Supervisor's SAML signatures): bindgen needs libclang; it binds and links libxmlsec1
# (with its OpenSSL engine) and libxml2.
compgen -G '/usr/lib/llvm-*/lib/libclang.so' >/dev/null || missing+=(libclang-dev)
[[ -e /usr/include/xmlsec1/xmlsec/xmlsec.h ]] || missing+=(libxmlsec1-dev)
[[ -e /usr/include/libxml2/libxml/parser.h ]] || missing+=(libxml2-dev)
# The node (e2e/src/node.rs): runc under containerd, iptables and conntrack for kube-proxy, haproxy
# (the load balancer in front of its Services), buildah for the images (e2e/scripts/
# build-images.sh), busybox-static for the tests' workload image.
command -v runc >/dev/null || missing+=(runc)
command -v iptables >/dev/null || missing+=(iptables)
command -v conntrack >/dev/null || missing+=(conntrack)
[[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
command -v buildah >/dev/null || missing+=(buildah)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo=""
  [[ $(id -u) == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || die "cargo $component is missing and rustup is not available to add it"
    log "adding Rust component $component"
    rustup component add "$component"
  fi
done

"$here/build-components.sh" all >/dev/null
"$here/build-components.sh" node >/dev/null

command -v npm >/dev/null || die "npm is not on PATH: install Node.js 20 or newer first"
rp_cache="${SELKIE_CACHE_DIR:-$HOME/.cache/selkie}/rp"
if ! cmp -s "$here/../rp/package-lock.json" "$rp_cache/package-lock.json" 2>/dev/null \
    || [[ ! -d "$rp_cache/node_modules/openid-client" ]]; then
  log "installing the relying-party library (openid-client) into $rp_cache"
  mkdir -p "$rp_cache"
  cp "$here/../rp/package.json" "$here/../rp/package-lock.json" "$rp_cache/"
  (cd "$rp_cache" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
log "ready"
