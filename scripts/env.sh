# Source this file (`source scripts/env.sh`, from any directory) so that plain `pulumi` commands in
# this shell use the state backend and passphrase `scripts/up.sh` deployed with. It exports
# PULUMI_BACKEND_URL=file://<repo>/.pulumi-state and PULUMI_CONFIG_PASSPHRASE_FILE=<repo>/.pulumi-state/passphrase,
# each only when you have not set your own: the rule of cloudstation_tools/local_backend.py, which the project's
# own `python -m infra` commands apply by themselves. It prints what it exported, nothing secret.
_cloudstation_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ ! -x "$_cloudstation_root/.venv/bin/python" ]; then
  echo "scripts/env.sh: $_cloudstation_root/.venv does not exist yet: run \`bash scripts/up.sh\` first" >&2
elif _cloudstation_exports="$(cd "$_cloudstation_root" && .venv/bin/python -m cloudstation_tools.local_backend)"; then
  if [ -n "$_cloudstation_exports" ]; then
    eval "$_cloudstation_exports"
    printf '%s\n' "$_cloudstation_exports" | sed 's|^|scripts/env.sh: |' >&2
  else
    echo "scripts/env.sh: nothing to export (PULUMI_BACKEND_URL or a passphrase is already set, or there is no .pulumi-state/ yet)" >&2
  fi
fi
unset _cloudstation_root _cloudstation_exports
