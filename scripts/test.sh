#!/usr/bin/env bash
# Set everything up on a fresh machine and run every test. Needs only Python 3.11+ (and apt-get
# as root for the registry tools the promotion tests run and the PostgreSQL server the backup tests
# run; without them those tests fail loudly).
set -euo pipefail
cd "$(dirname "$0")/.."

# Only what is missing, tool by tool: a tool installed another way (e.g. Node.js) is left alone.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  packages=()
  # PostgreSQL's server for the backup/restore tests (pg_ctlcluster comes with Debian's server package).
  for pair in docker-registry:docker-registry skopeo:skopeo htpasswd:apache2-utils node:nodejs pg_ctlcluster:postgresql; do
    command -v "${pair%%:*}" >/dev/null || packages+=("${pair#*:}")
  done
  if [ "${#packages[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
  fi
fi

python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

# Entity logic (Node's built-in test runner), then the Python suite.
if [ -d entities ] && find entities -name '*.test.mjs' -o -name '*.test.js' | grep -q .; then
  node --test $(find entities -name '*.test.mjs' -o -name '*.test.js' | grep -v node_modules | sort)
fi
# Tests in parallel processes (pytest-xdist), a module's tests in one process (its module-scoped
# fixtures are built once); CLOUDSTATION_TEST_WORKERS=1 runs them in this one.
# The 20 slowest tests are listed at the end (the suite's time budget: README, "Tests").
workers="${CLOUDSTATION_TEST_WORKERS:-2}"
if [ "$workers" -gt 1 ]; then
  .venv/bin/python -m pytest -q --durations=20 -n "$workers" --dist loadfile "$@"
else
  .venv/bin/python -m pytest -q --durations=20 "$@"
fi
