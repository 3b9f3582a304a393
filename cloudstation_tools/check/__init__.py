"""`cloudstation check`: every problem of the stack files of one project folder, at once, each with its
file, line, key, value and fix (docs/operations.md, "Check a change").

    stacks.py    read and validate each file (the config model), render it under mocks
    builds.py    a test stack that builds locally without having chosen it (a notice)
    across.py    what one file cannot know: stacks sharing a cluster (objects both would deploy,
                 NodePorts, Secrets read from another stack), the cluster budget, promotion steps
    graph.py     the rendered graph: Kubernetes schemas 1.33-1.37, the policy pack's rules
    data.py      claims a change leaves behind, against a baseline (cloudstation_tools/baseline.py)
    findings.py  what was found, as text, JSON or GitHub annotations

`run` is pure apart from reading the folder (and git, for a baseline): the CLI prints its report and
exits with its code (0 clean or notices and warnings only, 1 errors, 2 could not run).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from concurrent.futures import ThreadPoolExecutor

from cloudstation_tools.baseline import BaselineError, resolve_all
from cloudstation_tools.check import across, builds, data, graph
from cloudstation_tools.check.findings import FORMATS, NOTICE, Finding, Report  # noqa: F401
from infra.cluster_sharing import OWNER_KEY as _OWNER
from cloudstation_tools.check.stacks import IMAGES_OUTPUT, Stack, load, names, render_stack, source_of, timed


def run(root: Path, stack: Optional[str] = None, against: Optional[str] = None) -> Report:
    """Check every stack file of `root` (with `stack`: report what concerns that one)."""
    found = names(root)
    if not found:
        return Report([], could_not_run=f"no stack file (Pulumi.<stack>.yaml) in {root}")
    if stack is not None and stack not in found:
        return Report([], could_not_run=f"no Pulumi.{stack}.yaml in {root} (stack files: "
                                        f"{', '.join(f'Pulumi.{n}.yaml' for n in found)})")
    if against is not None and stack is None and len(found) > 1 and (Path(against) / "resources.json").is_file():
        return Report([], could_not_run=f"--against {against} is one stack's render: name that stack (--stack), or "
                                        "pass the directory holding one render per stack (<dir>/<stack>/resources.json)")
    if against is not None and Path(against).exists():
        against = str(Path(against).resolve())  # the renders below change the working directory (render.py)
    report = Report([f"Pulumi.{n}.yaml" for n in ([stack] if stack else found)])
    timings = report.timings
    # Baselines render in processes of their own (git refs): started first, they run beside the rest.
    pool = ThreadPoolExecutor(max_workers=1)
    baselines = pool.submit(timed, timings, "*", "baselines",
                            lambda: resolve_all(root, [stack] if stack else found, against, needs_change=True))
    pool.shutdown(wait=False)
    stacks: dict[str, Stack] = {n: timed(timings, n, "read and validate", lambda n=n: load(root, n)) for n in found}
    for item in stacks.values():
        item.problems = [_waiting_for_owner(f, stacks) for f in item.problems]
    source = source_of(stacks)
    # The source first: a prod stack is rendered with its rendered images.
    for item in sorted((s for s in stacks.values() if s.valid), key=lambda s: (s.is_prod, s is not source)):
        images = source.rendered.outputs.get(IMAGES_OUTPUT) if source and source.rendered else None
        timed(timings, item.name, "render", lambda item=item, images=images: render_stack(item, root, images))
    checked = [s for s in stacks.values() if stack is None or s.name == stack]
    findings: list[Finding] = [f for s in stacks.values() for f in s.problems]
    groups = timed(timings, "*", "clusters", lambda: across.clusters(stacks))
    for group in groups.values():
        crds = [o for s in group for o in s.rendered.manifests() if o["kind"] == "CustomResourceDefinition"]
        owned = any(s.config.platform.owns_cluster_resources for s in group)
        for item in (s for s in group if s in checked):
            findings += timed(timings, item.name, "schemas", lambda item=item: graph.schemas(item, crds, owned))
            findings += timed(timings, item.name, "policy pack", lambda item=item: graph.policy(item, root))
    for cluster, group in groups.items():
        findings += timed(timings, "*", "clusters", lambda: across.collisions(group, cluster) + across.secret_reads(group, cluster))
        findings += timed(timings, "*", "budget", lambda: across.budget(group, cluster))
    for item in stacks.values():
        if item.is_prod and item is not source:
            findings += across.promotion(item, source)
        if item.valid:
            findings += builds.local_by_default(item)
    resolved = baselines.result()
    for item in checked:
        found_baseline = resolved.get(item.name)
        if isinstance(found_baseline, BaselineError):
            if against is not None:
                report.could_not_run = str(found_baseline)
                return report
            findings += data.no_baseline(item, str(found_baseline))
        elif found_baseline is not None and item.rendered is not None:
            findings += timed(timings, item.name, "data left behind", lambda item=item, b=found_baseline: data.kept_claims(item, b))
    if stack is not None:
        mine = f"Pulumi.{stack}.yaml"
        findings = [f for f in findings if f.file == mine or mine in f.related]
        findings += [Finding(NOTICE, mine, f"{s.file} has problems of its own (`cloudstation check --stack {s.name}`): "
                             "the checks across stack files leave it out", "clusters")
                     for s in stacks.values() if s.name != stack and not s.valid]
    report.findings = findings
    return report


def _waiting_for_owner(finding: Finding, stacks: dict[str, Stack]) -> Finding:
    """A stack sharing its owner's cluster is checked against the owner's file, which validation quotes
    when it has problems (infra/cluster_sharing.py): reported once, in that file, and a notice here."""
    owner = (finding.value or "").strip("'")
    if finding.key != f"cloudstation:{_OWNER}" or "has problems of its own" not in finding.message or not stacks.get(owner, Stack(
            owner, "", None)).problems:
        return finding
    return Finding(NOTICE, finding.file, f"not checked against Pulumi.{owner}.yaml, the owner's stack file, until "
                   "that file's errors (listed under it) are fixed", "clusters", finding.key, finding.value,
                   finding.line, (f"Pulumi.{owner}.yaml",))
