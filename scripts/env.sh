# Source this file (`source scripts/env.sh`, from any directory) so that plain `pulumi` commands in
# this shell use the state backend and passphrase `scripts/up.sh` deployed with. It exports
# PULUMI_BACKEND_URL=file://<repo>/.pulumi-state and PULUMI_CONFIG_PASSPHRASE_FILE=<repo>/.pulumi-state/passphrase,
# each only when you have not set your own: the rule of cloudstation_tools/local_backend.py, which the project's
# own `python -m infra` commands apply by themselves. It also puts the project's .venv/bin first on
# PATH, so that `python -m infra ...` (as the docs write it) runs with the program's requirements, not
# a system Python without them. It prints what it changed, nothing secret.
_cloudstation_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
if [ ! -x "$_cloudstation_root/.venv/bin/python" ]; then
  echo "scripts/env.sh: $_cloudstation_root/.venv does not exist yet: run \`bash scripts/up.sh\` first" >&2
else
  case ":$PATH:" in
    *":$_cloudstation_root/.venv/bin:"*) ;;
    *) export PATH="$_cloudstation_root/.venv/bin:$PATH"
       echo "scripts/env.sh: PATH starts with $_cloudstation_root/.venv/bin (python -m infra runs with the project's requirements)" >&2 ;;
  esac
  if _cloudstation_exports="$(cd "$_cloudstation_root" && .venv/bin/python -m cloudstation_tools.local_backend)"; then
    if [ -n "$_cloudstation_exports" ]; then
      eval "$_cloudstation_exports"
      printf '%s\n' "$_cloudstation_exports" | sed 's|^|scripts/env.sh: |' >&2
    else
      echo "scripts/env.sh: nothing to export (PULUMI_BACKEND_URL or a passphrase is already set, or there is no .pulumi-state/ yet)" >&2
    fi
  fi
fi
unset _cloudstation_root _cloudstation_exports
