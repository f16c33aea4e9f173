#!/usr/bin/env bash
# The local demo (`make demo`): a real control plane, Dex as the upstream identity provider,
# Selkie's Supervisor and Concierge installed from conf/, `selkie get kubeconfig`, a login through
# the Supervisor, and the real kubectl through the Concierge's proxy — all on loopback, all stopped
# at the end unless KEEP=1. The work is done by the selkie-demo binary (e2e/src/bin/selkie-demo/).
# usage: demo.sh <selkie-demo binary>
set -euo pipefail
exec "$1"
