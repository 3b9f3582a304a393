#!/usr/bin/env bash
# Set everything up and deploy a stack (`pulumi up`; STACK defaults to test) with a local state
# backend (no Pulumi Cloud account). First `python -m infra check --stack STACK`: every problem of the
# stack files, with file, line and fix (cloudstation_tools/check/). Then, before any slow work, it
# checks, all at once, everything the
# deployment needs (`python -m infra preflight`, cloudstation_tools/preflight.py): the stack file, the Pulumi
# CLI, kubectl, the cluster of the stack's kube context (reachable, Kubernetes 1.33 to 1.37,
# kube-proxy mode) and, when the stack builds entity images, the Docker engine; each problem is
# printed with its fix and nothing is deployed.
#
# The kube context is `cloudstation:kubernetes.context` of Pulumi.<STACK>.yaml, else kubectl's
# current context, resolved once: every kubectl call below passes it, so the port-forwards reach
# the cluster `pulumi up` deploys to.
#
#   bash scripts/up.sh [STACK] [extra pulumi up flags]
set -euo pipefail
cd "$(dirname "$0")/.."
stack="${1:-test}"; shift || true

if ! command -v python3 >/dev/null || ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: python3 must be Python 3.11 or newer (https://www.python.org/downloads/)" >&2
  exit 1
fi

# The program's virtualenv (Pulumi.yaml `virtualenv`); requirements.txt is installed again only
# when it changed since the last install (after a `git pull`, for instance).
[ -x .venv/bin/python ] || python3 -m venv .venv
wanted="$(.venv/bin/python -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' requirements.txt)"
if [ "$(cat .venv/.requirements.sha256 2>/dev/null || true)" != "$wanted" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  echo "$wanted" > .venv/.requirements.sha256
fi

# The stack files first: every problem with its file, line and fix; warnings and notices (data a
# change leaves behind, a promotion to do) are printed and do not stop the deployment.
if ! .venv/bin/python -m infra check --stack "$stack" >&2; then
  echo "scripts/up.sh: \`python -m infra check --stack $stack\` found the errors above: nothing was deployed" >&2
  exit 1
fi

# Every check, every problem listed together with its fix; prints the kube context.
context="$(.venv/bin/python -m infra preflight --stack "$stack")" || exit 1
kubectl=(kubectl --context "$context")

# The whole program under mocks: a program error stops here, before the cluster is touched.
.venv/bin/python -m infra render --stack "$stack" --out ".cloudstation/rendered/$stack" >/dev/null

# Local state backend `.pulumi-state/` and a generated passphrase for the stack's secrets, unless
# PULUMI_BACKEND_URL is set: the rule `python -m infra ...` and scripts/env.sh also follow.
eval "$(.venv/bin/python -m cloudstation_tools.local_backend --create)"
pulumi stack select --create "$stack" --non-interactive

# `pulumi up` manages Armada queues through the server's REST API and, with local builds, pushes
# entity images to the in-cluster registry, both through port-forwards (docs/armada-queues.md,
# docs/registry.md); `python -m infra port-forwards` lists those this stack needs. Armada builds
# reach the registry through their own tunnel via the Kubernetes API (docs/builds.md).
# On a first deployment those services appear during this very run, so each forward retries until
# its service answers; all of them stop when this script exits.
forwards=()
# (`|| true`: under `set -e` a forward that already ended would turn a successful run into exit 1.)
trap 'for pid in ${forwards[@]+"${forwards[@]}"}; do pkill -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done' EXIT
if [ -n "$context" ]; then   # empty with kubernetes.renderYamlToDirectory: no cluster
  while read -r namespace service ports; do
    [ -n "$namespace" ] || continue
    ( until "${kubectl[@]}" -n "$namespace" port-forward "svc/$service" "$ports" >/dev/null 2>&1; do sleep 2; done ) &
    forwards+=("$!")
  done < <(.venv/bin/python -m infra port-forwards --stack "$stack")
fi

pulumi up --stack "$stack" --yes --non-interactive "$@"

# What this checkout deployed: the baseline of `python -m infra diff` and of check's data-left-behind
# warning (cloudstation_tools/baseline.py). Only after a successful `pulumi up` (set -e).
rm -rf ".cloudstation/deployed/$stack"
mkdir -p .cloudstation/deployed
cp -R ".cloudstation/rendered/$stack" ".cloudstation/deployed/$stack"
