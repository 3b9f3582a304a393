#!/usr/bin/env bash
# Set everything up and deploy the test stack (`pulumi up`) to the current kube context, with a
# local state backend (no Pulumi Cloud account). Needs: Python 3.11+, the Pulumi CLI on PATH, a
# kubeconfig whose current context is the target cluster, and a Docker engine for the image builds.
#
#   bash scripts/up.sh [STACK] [extra pulumi up flags]      (STACK defaults to test)
set -euo pipefail
cd "$(dirname "$0")/.."
stack="${1:-test}"; shift || true

for tool in pulumi kubectl; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not on PATH (see README.md, Quickstart)" >&2; exit 1; }
done
kubectl config current-context >/dev/null || { echo "error: no current kube context" >&2; exit 1; }

python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

# Validate the stack file before touching the cluster (same checks as the program).
.venv/bin/python -m infra render --stack "$stack" --out ".cloudstation/rendered/$stack" >/dev/null

# Local state backend and a generated passphrase for the stack's secrets, kept out of git.
mkdir -p .pulumi-state
export PULUMI_BACKEND_URL="${PULUMI_BACKEND_URL:-file://$PWD/.pulumi-state}"
if [ -z "${PULUMI_CONFIG_PASSPHRASE:-}" ] && [ -z "${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
  [ -f .pulumi-state/passphrase ] || (umask 077; .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(32))' > .pulumi-state/passphrase)
  export PULUMI_CONFIG_PASSPHRASE_FILE="$PWD/.pulumi-state/passphrase"
fi
pulumi stack select --create "$stack" --non-interactive

# `pulumi up` pushes entity images to the in-cluster registry and manages Armada queues through
# the server's REST API, both through port-forwards (docs/registry.md, docs/armada-queues.md).
# On a first deployment those services appear during this very run, so each forward retries until
# its service answers; all of them stop when this script exits.
forwards=()
trap 'for pid in "${forwards[@]}"; do pkill -P "$pid" 2>/dev/null; kill "$pid" 2>/dev/null; done; true' EXIT
while read -r namespace service ports; do
  [ -n "$namespace" ] || continue
  ( until kubectl -n "$namespace" port-forward "svc/$service" "$ports" >/dev/null 2>&1; do sleep 2; done ) &
  forwards+=("$!")
done < <(.venv/bin/python -m infra port-forwards --stack "$stack")

pulumi up --stack "$stack" --yes --non-interactive "$@"
