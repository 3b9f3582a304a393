#!/usr/bin/env bash
# Set everything up on a fresh machine and run every test. Needs only Python 3.11+ (and apt-get
# as root for the registry tools the promotion tests run; without them those tests fail loudly).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=""
  for tool in docker-registry skopeo htpasswd node; do command -v "$tool" >/dev/null || missing=1; done
  if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry skopeo apache2-utils nodejs >/dev/null
  fi
fi

python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

# Entity logic (Node's built-in test runner), then the Python suite.
if [ -d entities ] && find entities -name '*.test.mjs' -o -name '*.test.js' | grep -q .; then
  node --test $(find entities -name '*.test.mjs' -o -name '*.test.js' | grep -v node_modules | sort)
fi
.venv/bin/python -m pytest -q "$@"
