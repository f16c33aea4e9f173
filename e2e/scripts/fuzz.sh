#!/usr/bin/env bash
# Runs Selkie's fuzz targets (fuzz/: cargo-fuzz + libFuzzer, AddressSanitizer) for a bounded time
# each, and fails if any of them finds a crash:
#   jwt_token       bearer tokens into the JWT authenticator (no forged token may authenticate)
#   jwks_document   JWKS documents into the JWT authenticator's key-set parser
#   x509_identity   client certificates into the x509 authenticator (none may authenticate)
#   header_policy   header maps and users into the proxy's header policy (no credential field
#                   survives stripping; requested impersonation and Impersonate-* round trips agree)
#   supervisor_authorize  authorization requests into the Supervisor's oauth2/authorize (answers are
#                   OAuth errors, redirects to registered URIs or a sealed continuation; no code)
#   supervisor_token      token and revocation requests into oauth2/token and oauth2/revoke (no
#                   tokens without a grant; errors are OAuth JSON errors)
#   supervisor_sealed     sealed states and CSRF cookies, opened directly and by callback and login
#                   (nothing opens unless sealed with the key; endpoints answer 400/403)
#   supervisor_cel        identity transforms and policies (CEL) compiled and run at and beyond
#                   their budget (errors are errors; outcomes well-formed; examples agree)
#   supervisor_specs      OIDCClients, FederationDomains and identity providers into the controllers'
#                   checks (conditions well-formed; only valid objects are served)
#   supervisor_github     GitHub API and OAuth answers into the GitHub identity provider (the token
#                   goes only to the API; identities well-formed; no secret in errors)
#   supervisor_ldap       directory entries (BER and parsed) and typed values into the LDAP and Active
#                   Directory identity providers (identities, groups, filters ldap3 parses back)
#   supervisor_saml       SAML responses and identity-provider metadata into the Supervisor's SAML
#                   checks (libxmlsec1 included; only the signed identity ever verifies)
# The toolchain is stable: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its nightly flags. cargo-fuzz
# itself is installed (pinned) into ~/.cargo/bin when that version is missing. The fuzz crate is
# its own workspace; its lock file (not in git) is copied from the main Cargo.lock, so it builds
# the versions `cargo test --locked` tests. Each target starts from its checked-in seeds
# (fuzz/seeds/<target>) and its corpus (fuzz/corpus/<target>, kept between runs, except for the
# targets in FRESH_CORPUS, which start from their seeds every time); the corpus, crash inputs
# (fuzz/artifacts/<target>/), logs and the build (fuzz/target) stay out of git.
# Prints one summary line per target; on a crash, the input's path, the panic, and how to
# reproduce it.
#
# `fuzz.sh --build-only` installs cargo-fuzz and builds the targets, and runs none (make test
# starts it, niced, beside the cargo tests, so a cold build costs no wall time of its own).
#
# usage: fuzz.sh [seconds-per-target]      (default: 20)
#        fuzz.sh --build-only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
log() { printf '[fuzz] %s\n' "$*" >&2; }
die() { printf '[fuzz] error: %s\n' "$*" >&2; exit 1; }

CARGO_FUZZ_VERSION=0.13.2
TARGETS=(jwt_token jwks_document x509_identity header_policy supervisor_authorize supervisor_token
  supervisor_sealed supervisor_cel supervisor_specs supervisor_github supervisor_ldap supervisor_saml)
# libFuzzer runs a target's whole corpus before it mutates anything, whatever -max_total_time says.
# One input of these costs milliseconds (supervisor_cel: parsing CEL under AddressSanitizer), so a
# corpus kept between runs would soon take longer to run than the run's time: theirs is dropped.
FRESH_CORPUS=(supervisor_cel)
build_only=0
if [[ "${1:-}" == --build-only ]]; then
  build_only=1
  shift
fi
seconds="${1:-20}"
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [seconds-per-target] (a positive integer, not '$seconds')"

command -v cargo >/dev/null || die "cargo is not on PATH: install Rust stable (rustup) first"
if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
  log "installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

cd "$root"
# Every run starts from the main lock file; cargo drops what the fuzz crate does not use and adds
# only libfuzzer-sys and its dependencies arbitrary and jobserver.
cp Cargo.lock fuzz/Cargo.lock
export RUSTC_BOOTSTRAP=1
logs=fuzz/target/fuzz-logs
mkdir -p "$logs"

log "building ${TARGETS[*]} (AddressSanitizer; a cold build takes minutes; log: $logs/build.log)"
start=$SECONDS
if ! cargo fuzz build >"$logs/build.log" 2>&1; then
  printf '[fuzz] error: building the fuzz targets failed\n--- last 30 lines of %s ---\n' "$logs/build.log" >&2
  tail -n 30 "$logs/build.log" >&2
  exit 1
fi
log "built in $((SECONDS - start))s"
((build_only)) && exit 0

crashed=()
for target in "${TARGETS[@]}"; do
  logfile="$logs/$target.log"
  args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30)
  [[ -f "fuzz/dicts/$target.dict" ]] && args+=(-dict="fuzz/dicts/$target.dict")
  # New inputs go to the first directory; the seeds are only read.
  if [[ " ${FRESH_CORPUS[*]} " == *" $target "* ]]; then
    rm -rf "fuzz/corpus/$target"
  fi
  dirs=("fuzz/corpus/$target")
  [[ -d "fuzz/seeds/$target" ]] && dirs+=("fuzz/seeds/$target")
  mkdir -p "${dirs[0]}" "fuzz/artifacts/$target"
  stamp="$logs/$target.started"
  touch "$stamp"
  if cargo fuzz run "$target" "${dirs[@]}" -- "${args[@]}" >"$logfile" 2>&1; then
    # libFuzzer's last status line: "#<runs> DONE cov: <n> ft: <n> corp: <n>/<size> ... exec/s: <n> ..."
    awk -v target="$target" -v secs="$seconds" '
      /^#[0-9]+[ \t]+DONE/ {
        runs = substr($1, 2)
        for (i = 2; i < NF; i++) value[$i] = $(i + 1)
      }
      END {
        printf "[fuzz] %s: %s runs in %ss (%s exec/s), coverage %s, corpus %s; no crash\n",
          target, runs, secs, value["exec/s:"], value["cov:"], value["corp:"]
      }' "$logfile" >&2
  else
    crashed+=("$target")
    artifacts=$(find "fuzz/artifacts/$target" -type f -newer "$stamp" | sort)
    printf '[fuzz] error: %s failed; log: %s\n' "$target" "$logfile" >&2
    # A Rust panic prints its message on the line after "panicked at"; ASan reports start with "==".
    grep -m 1 -A 1 "panicked at" "$logfile" >&2 || true
    grep -m 3 -E "^==[0-9]+==ERROR|^SUMMARY:|deadly signal" "$logfile" >&2 || true
    if [[ -n "$artifacts" ]]; then
      while read -r artifact; do
        printf '[fuzz] crash input: %s\n[fuzz] reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run %s %s\n' \
          "$artifact" "$target" "$artifact" >&2
      done <<<"$artifacts"
    else
      printf -- '--- last 30 lines of %s ---\n' "$logfile" >&2
      tail -n 30 "$logfile" >&2
    fi
  fi
done

((${#crashed[@]} == 0)) || die "${#crashed[@]} of ${#TARGETS[@]} fuzz targets failed: ${crashed[*]}"
log "${#TARGETS[@]} fuzz targets ran ${seconds}s each without a crash"
