#!/usr/bin/env bash
# The local demo (`make demo`): a real control plane, Dex as the identity provider, Selkie's
# Concierge installed from conf/ (impersonation proxy, control plane, aggregated API), `selkie get
# kubeconfig`, a login, and the real kubectl through the proxy — all on loopback, all stopped at
# the end. The work is done by the selkie-demo binary (e2e/src/bin/selkie-demo.rs).
# usage: demo.sh <selkie-demo binary>
set -euo pipefail
exec "$1"
