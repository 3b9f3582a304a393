"""Checks of one stack's rendered graph: every object against the Kubernetes schemas of 1.33 to 1.37
and the CRDs (cloudstation_tools/validate.py), and the policy pack's rules as `pulumi preview
--policy-pack policy --policy-pack-config policy/config.json` runs them (cloudstation_tools/policy_offline.py).

What they find comes from the program, not from one key: the finding names the object (and the
rule), in the stack file it was rendered from."""
from __future__ import annotations

import re
from pathlib import Path

from cloudstation_tools import policy_offline, validate
from cloudstation_tools.check.findings import ERROR, NOTICE, Finding
from cloudstation_tools.check.stacks import Stack, opted_out


NO_CRD = "no CRD among the rendered objects defines"
"""validate.custom_errors' words for a custom resource whose CRD is not known."""


def schemas(stack: Stack, crds: list[dict] = (), crds_known: bool = True) -> list[Finding]:
    """`crds`: those the stacks of its cluster install (a stack sharing the owner's cluster uses its
    CRDs); without the owner's render (`crds_known` false) custom resources are left unchecked, said once."""
    problems = _per_versions(validate.validate_all(stack.rendered.manifests(), extra_crds=crds))
    unknown = [p for p in problems if NO_CRD in p] if not crds_known else []
    found = [Finding(ERROR, stack.file, f"rendered {problem} (the API server would refuse it)", "schemas")
             for problem in problems if problem not in unknown]
    if unknown:
        found.append(Finding(NOTICE, stack.file, f"{len(unknown)} custom resources not checked against their CRDs: the "
                             "stack that owns this cluster did not render (its own findings say why)", "schemas"))
    return found


_AT_VERSION = re.compile(r"^(?P<what>.*?) @ (?P<version>\d+\.\d+): (?P<problem>.*)$", re.S)


def _per_versions(problems: list[str]) -> list[str]:
    """One problem per object and path, naming the versions it fails on (`@ 1.33, 1.34, ...`), not one per version."""
    grouped: dict[tuple[str, str], list[str]] = {}
    out: list = []
    for problem in problems:
        match = _AT_VERSION.match(problem)
        if not match:
            out.append(problem)
            continue
        key = (match["what"], match["problem"])
        if key not in grouped:
            grouped[key] = []
            out.append(key)
        grouped[key].append(match["version"])
    return [item if isinstance(item, str) else f"{item[0]} @ {', '.join(grouped[item])}: {item[1]}" for item in out]


def policy(stack: Stack, root: Path) -> list[Finding]:
    # An image by tag is already the stack's config error (stacks.py): not reported twice.
    values = opted_out(stack.values) if stack.unpinned_for_review else stack.values
    violations = policy_offline.run(stack.rendered.registrations, stack.name, values.values, root)
    return [Finding(ERROR, stack.file, f"rendered {v.message} (`pulumi preview --policy-pack policy` refuses it)",
                    f"policy:{v.policy}") if v.applicable else
            Finding(NOTICE, stack.file, f"not applicable here: {v.message}", f"policy:{v.policy}") for v in violations]
