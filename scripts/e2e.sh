#!/usr/bin/env bash
# The end-to-end tier (README, "End-to-end tests"): the real Pulumi CLI and engine, the real
# Kubernetes provider and a real API server (etcd, kube-apiserver, controller manager, scheduler,
# with kwok's fake nodes), built from the Go modules under e2e/tools/ into a cache outside the clone,
# run the scenario of e2e/test_scenario.py on this tree's stack files, on the newest and the oldest
# Kubernetes the tier builds. Stops everything it started; exit 0 only when every step passed; the
# last line is `e2e: N passed, M failed`.
#
#   bash scripts/e2e.sh [pytest args, e.g. -k test_1 --keep]
# Needs Go (go.mod's version), Python 3.11+, openssl, git; as root it installs the rest (Node.js for
# the entities' tests, run by the fake executor).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  packages=()
  for pair in node:nodejs openssl:openssl git:git; do
    command -v "${pair%%:*}" >/dev/null || packages+=("${pair#*:}")
  done
  if [ "${#packages[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

tools="$(mktemp)" summary="$(mktemp)"
trap 'rm -f "$tools" "$summary"' EXIT
start=$SECONDS
bash e2e/build-tools.sh > "$tools"
echo "e2e: tools ready in $((SECONDS - start)) s" >&2

# Newest and oldest Kubernetes the tier builds (e2e/tools/kubernetes-*).
versions="$(cd e2e/tools && ls -d kubernetes-* | sort -t. -k2 -n -r | paste -sd, -)"
set +e
.venv/bin/python -m pytest e2e -p no:cacheprovider -q -rfE --tools "$tools" --kubernetes "$versions" \
  --summary "$summary" "$@"
status=$?
set -e
# The tally again, last (pytest's own summary line follows its hooks'); a run that never got to its
# steps (a collection error) counts as one failure.
if [ -s "$summary" ]; then cat "$summary"; else echo "e2e: 0 passed, 1 failed"; status=1; fi
exit "$status"
