#!/usr/bin/env bash
# The local demo: a real control plane on loopback, used with the real kubectl, then stopped.
# (Grows into the full login demo — Selkie, an identity provider, a login, kubectl through the
# impersonation proxy — as those parts land.)
# usage: demo.sh <selkie-cluster binary> <cluster dir>
set -euo pipefail
bin=$1 dir=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kubectl="$("$here/build-components.sh" kubernetes | sed -n 's/^kubernetes=//p')/kubectl"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

trap '"$bin" --dir "$dir" down' EXIT
step "Starting etcd and kube-apiserver on loopback"
kubeconfig=$("$bin" --dir "$dir" up | tail -n 1)
export KUBECONFIG=$kubeconfig KUBECACHEDIR="$dir/kubectl-cache"

step "The real kubectl against the real apiserver"
run "$kubectl" version
run "$kubectl" get namespaces
run "$kubectl" auth whoami

step "Stopping the control plane"
