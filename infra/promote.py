"""Promotion: copy the test stack's deployed, digest-pinned image references into the prod stack file.

    python -m infra promote --from test --to prod [--project P ...] [--entity P/E ...] [--dry-run]
    python -m infra rollback --stack prod [--dry-run]

A promotion, in this order (any refusal before step 7 leaves the stack file and the history as they
were; tags added in step 6 stay, they only mark images):
1. lock the project directory (one promote or rollback at a time) and read and validate
   promotions.<to>.jsonl; a record left `pending` by a killed run is settled from the stack file;
2. parse Pulumi.<to>.yaml once, and read the test stack's `images` output from its state;
3. refuse unless every selected entity is on both sides and every test reference is digest-pinned,
   in the target stack's registry, at the entity's repository (`<prefix>/<project>/<entity>`);
4. compute the exact edit of Pulumi.<to>.yaml and validate the result as the program would;
5. fetch each manifest by digest from its registry (refuse if any is missing);
6. tag each promoted manifest `<to>` and `<to>-<UTC timestamp>` inside its registry (manifest
   bytes only, no layers): one GET and one PUT per tag, on kept-alive connections, a bounded
   number of images at a time;
7. append the record as `pending`, write the stack file atomically, mark the record `done`.

`rollback` undoes the latest promotion that has not been rolled back, the same way, and records
that too. Registry credentials are read by infra/registry_api.py and never printed. Everything
that waits on the network shares one deadline (`timeout`, infra/limits.py).
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from infra import registry_api, stack_file, state_backend
from infra import config as stack_config
from infra.config import ConfigError
from infra.image_refs import entity_repository, is_digest_ref, reference_problem
from infra.limits import DEFAULT_DEADLINE_SECONDS, Deadline

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one run at a time is then up to the user
    fcntl = None

IMAGES_OUTPUT = "images"
PARALLEL = 8
"""Images verified and tagged at once (and connections kept per registry)."""
STATES = ("pending", "done", "abandoned")
"""A record is `pending` from just before the stack file is written until just after; a record a
killed run left pending is `done` if the file holds its references, `abandoned` if it holds the
previous ones. Records without `state` (written before states existed) are done."""
WHEN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


class PromotionRefused(Exception):
    """Nothing was changed; str() lists every reason."""

    def __init__(self, problems: list[str], what: str = "promotion"):
        self.problems = problems
        super().__init__(f"{what} refused, nothing was changed:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class Change:
    key: str
    path: str
    previous: Optional[str]
    new: str


@dataclass
class Result:
    stack_file: Path
    changes: list[Change]
    before: str = field(repr=False)
    after: str = field(repr=False)
    tags: list[str] = field(default_factory=list)
    dry_run: bool = False
    stats: registry_api.Stats = field(default_factory=registry_api.Stats)
    record: Optional[dict] = None

    @property
    def diff(self) -> str:
        """The unified diff of the stack file (computed when shown)."""
        name = self.stack_file.name
        return "".join(difflib.unified_diff(
            self.before.splitlines(keepends=True), self.after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
        ))


def stack_path(root: Path, stack: str) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def history_path(root: Path, stack: str) -> Path:
    return root / f"promotions.{stack}.jsonl"


# --- the history file ------------------------------------------------------------------------


def state_of(record: dict) -> str:
    return record.get("state", "done")


def read_history(root: Path, stack: str, what: str = "promotion") -> list[dict]:
    """Every record of promotions.<stack>.jsonl, validated; refuses (naming the line) if any is not
    a record this tool wrote, since rollback would act on it."""
    return _read_history(history_path(root, stack), what)[1]


def _read_history(path: Path, what: str) -> tuple[str, list[dict]]:
    if not path.is_file():
        return "", []
    text = path.read_bytes().decode("utf-8", "replace")
    records, problems = [], []
    lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    for position, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as error:
            problems.append(f"{path.name} line {number}: not JSON ({error.msg})")
            continue
        found = _record_problems(record, len(records) + 1, records, last=position == len(lines) - 1)
        problems += [f"{path.name} line {number}: {p}" for p in found]
        records.append(record)
    if problems:
        raise PromotionRefused(problems + [f"fix or remove those lines of {path} by hand, then run it again"], what)
    return text, records


def _record_problems(record, expected_id: int, earlier: list[dict], last: bool) -> list[str]:
    if not isinstance(record, dict):
        return ["not a JSON object"]
    problems = []
    if record.get("id") != expected_id:
        problems.append(f"id {record.get('id')!r}, expected {expected_id} (ids count up from 1)")
    if not isinstance(record.get("when"), str) or not WHEN.match(record["when"]):
        problems.append(f"when {record.get('when')!r} is not a UTC time like 2026-03-04T05:06:07Z")
    if record.get("action") not in ("promote", "rollback"):
        problems.append(f"action {record.get('action')!r} is not promote or rollback")
    references, previous = record.get("references"), record.get("previous")
    if not isinstance(references, dict) or not references or not all(
        isinstance(k, str) and "/" in k and is_digest_ref(v) for k, v in references.items()
    ):
        problems.append("references must map <project>/<entity> to digest-pinned references")
    elif not isinstance(previous, dict) or set(previous) != set(references) or not all(
        v is None or is_digest_ref(v) for v in previous.values()
    ):
        problems.append("previous must map the same keys to digest-pinned references (or null)")
    if not isinstance(record.get("tags"), list) or not all(isinstance(t, str) for t in record["tags"]):
        problems.append("tags must be a list of strings")
    if record.get("state", "done") not in STATES:
        problems.append(f"state {record.get('state')!r} is not one of {', '.join(STATES)}")
    elif record.get("state") == "pending" and not last:
        problems.append("only the last record can be pending")
    if record.get("action") == "rollback":
        undone = next((r for r in earlier if r.get("id") == record.get("undoes")), None)
        if undone is None or undone.get("action") != "promote":
            problems.append(f"undoes {record.get('undoes')!r}, which is not an earlier promotion")
    return problems


def _append(path: Path, record: dict) -> None:
    """Append one line, durably; a file whose last line lacks its newline gets one first."""
    created = not path.exists()
    with open(path, "a+b") as handle:
        handle.seek(0, os.SEEK_END)
        prefix = b""
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            prefix = b"" if handle.read(1) == b"\n" else b"\n"
        handle.write(prefix + json.dumps(record).encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    if created:
        stack_file.sync_directory(path.parent)


def _settle(path: Path, text: str, record: dict, state: str) -> None:
    """Rewrite the last record (the pending one) with its final state, atomically."""
    body = text.rstrip("\n")
    head, _, last = body.rpartition("\n")
    if json.loads(last).get("id") != record["id"]:
        raise PromotionRefused([f"{path.name}: the last line is not record {record['id']}"])
    settled = {**record, "state": state}
    stack_file.write_atomic(path, (head + "\n" if head else "") + json.dumps(settled) + "\n", expected=text)
    record["state"] = state


def _settle_pending(path: Path, text: str, history: list[dict], parsed: stack_file.Parsed, dry_run: bool,
                    what: str) -> None:
    """A record a killed run left pending: done if the stack file holds its references (the file
    was written), abandoned if it holds the previous ones (it was not)."""
    if not history or state_of(history[-1]) != "pending":
        return
    record = history[-1]
    current = {key: slot.value for key, slot in parsed.slots.items()}
    if all(key in current and current[key] == ref for key, ref in record["references"].items()):
        state = "done"
    elif all(key in current and current[key] == ref for key, ref in record["previous"].items()):
        state = "abandoned"
    else:
        raise PromotionRefused([
            f"{path.name}: record {record['id']} ({record['action']}, {record['when']}) was interrupted and "
            f"{parsed.source} now holds neither its references nor the previous ones; set its state to "
            f"\"done\" or \"abandoned\" by hand"
        ], what)
    if dry_run:
        record["state"] = state
    else:
        _settle(path, text, record, state)


@contextlib.contextmanager
def _locked(root: Path, what: str) -> Iterator[None]:
    """One promote or rollback at a time in a project directory: an exclusive flock on the
    directory itself (no lock file to clean up; released when the process ends, even if killed)."""
    if fcntl is None:
        yield
        return
    descriptor = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PromotionRefused(
                [f"another promote or rollback is running in {root}; wait for it to finish"], what
            ) from None
        yield
    finally:
        os.close(descriptor)


# --- selection and the registry rule ------------------------------------------------------------


def registry_of(parsed: stack_file.Parsed, what: str = "promotion") -> tuple[str, str]:
    """(pull host, repository prefix) of the stack file's registry (platform.registry)."""
    platform = parsed.data["config"].get(stack_file.PLATFORM) or {}
    section = (platform.get("registry") if isinstance(platform, dict) else None) or {}
    try:
        registry = stack_config.RegistryConfig.model_validate(section)
    except ValueError as error:
        raise PromotionRefused(
            [f"{parsed.source}: {stack_file.PLATFORM}.registry is not valid: {str(error).splitlines()[0]}"], what
        ) from None
    return registry.pull_host, registry.repository_prefix


def _slot_problem(key: str, ref: str, registry: tuple[str, str]) -> Optional[str]:
    project, _, entity = key.partition("/")
    return reference_problem(ref, registry[0], entity_repository(registry[1], project, entity))


def select(
    images: dict[str, str], slots: dict[str, stack_file.ImageSlot], projects: Iterable[str], entities: Iterable[str],
    source: str, target: str, registry: Optional[tuple[str, str]] = None,
) -> dict[str, str]:
    """The test references to promote, keyed `<project>/<entity>`; refuses on any problem.

    `registry` is the target's (pull host, prefix): each reference must be there, at its entity's
    repository, or prod would run an image from elsewhere with credentials meant for its registry."""
    projects, entities = list(projects), list(entities)
    problems: list[str] = []
    both = set(images) | set(slots)
    if not projects and not entities:
        keys = both
    else:
        keys = set()
        for project in projects:
            found = {k for k in both if k.split("/", 1)[0] == project}
            if not found:
                problems.append(f"--project {project}: no such project in the {source} stack or Pulumi.{target}.yaml")
            keys |= found
        for entity in entities:
            if "/" not in entity:
                problems.append(f"--entity {entity!r}: must be <project>/<entity>, e.g. shop/cart")
            elif entity not in both:
                problems.append(f"--entity {entity}: no such entity in the {source} stack or Pulumi.{target}.yaml")
            keys.add(entity)
        keys &= both
    for key in sorted(keys):
        if key not in images:
            problems.append(
                f"{key}: in Pulumi.{target}.yaml ({slots[key].path}) but missing from the {source} stack's "
                f"`{IMAGES_OUTPUT}` output — deploy it to {source} first"
            )
        elif key not in slots:
            problems.append(
                f"{key}: deployed in {source} but missing from Pulumi.{target}.yaml — add the entity to "
                f"{stack_file.PROJECTS} there first"
            )
        elif not is_digest_ref(images[key]):
            problems.append(
                f"{key}: the {source} reference {images[key]!r} is not pinned by digest "
                f"(<registry>/<repository>[:tag]@sha256:<64 hex>)"
            )
        elif registry is not None and (problem := _slot_problem(key, images[key], registry)):
            problems.append(f"{key}: the {source} reference {images[key]!r}: {problem}")
    if problems:
        raise PromotionRefused(problems)
    return {key: images[key] for key in sorted(keys)}


# --- the registry work, in parallel ------------------------------------------------------------


class _Registries:
    """One client per registry host, and their combined cost."""

    def __init__(self, connect: Callable[[str], registry_api.Registry]):
        self.connect = connect
        self.clients: dict[str, registry_api.Registry] = {}
        self.lock = threading.Lock()

    def __call__(self, host: str) -> registry_api.Registry:
        with self.lock:
            if host not in self.clients:
                self.clients[host] = self.connect(host)
            return self.clients[host]

    def stats(self) -> registry_api.Stats:
        total = registry_api.Stats()
        for client in self.clients.values():
            total.add(client.stats)
        return total


def _run(jobs: list[Callable[[], object]], parallel: int) -> list[object]:
    """Each job's result, or the RegistryError it raised, in order; at most `parallel` at once."""
    def attempt(job):
        try:
            return job()
        except registry_api.RegistryError as error:
            return error

    if len(jobs) <= 1 or parallel <= 1:
        return [attempt(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=min(parallel, len(jobs))) as pool:
        return list(pool.map(attempt, jobs))


def _fetch(refs: dict[str, str], registries: _Registries, what: str, parallel: int) -> dict[str, registry_api.Manifest]:
    """Each reference's manifest from its registry; refuses if any digest is not there."""
    images = {key: registry_api.ImageRef.parse(ref) for key, ref in refs.items()}
    try:
        clients = {key: registries(image.registry) for key, image in images.items()}
    except registry_api.RegistryError as error:
        raise PromotionRefused([str(error)], what) from None
    jobs = [functools.partial(clients[key].manifest, image) for key, image in images.items()]
    manifests, problems = {}, []
    for (key, image), manifest in zip(images.items(), _run(jobs, parallel)):
        if isinstance(manifest, registry_api.RegistryError):
            problems.append(f"{key}: {manifest}")
        elif manifest is None:
            problems.append(f"{key}: {image.digest} is not in the registry ({image.registry}/{image.repository})")
        else:
            manifests[key] = manifest
    if problems:
        raise PromotionRefused(problems, what)
    return manifests


def _tag(changes: list[Change], manifests: dict, tags: list[str], registries: _Registries, what: str,
         parallel: int) -> None:
    jobs, labels = [], []
    for change in changes:
        image = registry_api.ImageRef.parse(change.new)
        for tag in tags:
            jobs.append(functools.partial(registries(image.registry).tag, image, manifests[change.key], tag))
            labels.append(change.key)
    problems = [f"{key}: {error}" for key, error in zip(labels, _run(jobs, parallel)) if error is not None]
    if problems:
        # Tags already added stay (they only mark images); the stack file is not written.
        raise PromotionRefused(problems + ["tags already added stay; run it again once fixed"], what)


# --- promote and rollback ----------------------------------------------------------------------


def _apply(
    root: Path, stack: str, parsed: stack_file.Parsed, refs: dict[str, str], record: dict, history: list[dict],
    *, dry_run: bool, registries: _Registries, now: Optional[datetime], what: str,
    parallel: int,
) -> Result:
    path = stack_path(root, stack)
    slots = parsed.slots
    changes = [Change(k, slots[k].path, slots[k].value, ref) for k, ref in refs.items() if slots[k].value != ref]
    try:
        edited = stack_file.apply(parsed, {c.key: c.new for c in changes})
        stack_file.validate(edited, root, path.name)
    except (ConfigError, stack_file.StackFileError) as error:  # the edit would not be a valid stack file
        raise PromotionRefused([str(error)], what) from None
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    tags = [stack, f"{stack}-{when:%Y%m%dT%H%M%SZ}"]
    result = Result(path, changes, parsed.text, edited.text, tags, dry_run)
    manifests = _fetch({c.key: c.new for c in changes}, registries, what, parallel)
    if dry_run or not changes:
        result.stats = registries.stats()
        return result
    _tag(changes, manifests, tags, registries, what, parallel)
    result.record = {
        "id": len(history) + 1,
        "when": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **record,
        "references": {c.key: c.new for c in changes},
        "previous": {c.key: c.previous for c in changes},
        "tags": tags,
        "state": "pending",
    }
    # The record goes first: a run killed after the rename below still has it, and the next run
    # settles it from the file (_settle_pending).
    history_file = history_path(root, stack)
    _append(history_file, result.record)
    stack_file.write_atomic(path, edited.text, expected=parsed.text)
    _settle(history_file, stack_file.read_text(history_file), result.record, "done")
    result.stats = registries.stats()
    return result


def _start(root: Path, stack: str, dry_run: bool, what: str):
    """Under the lock: the validated history (a pending record settled) and the parsed stack file."""
    history_text, history = _read_history(history_path(root, stack), what)
    path = stack_path(root, stack)
    try:
        parsed = stack_file.parse(stack_file.read_text(path), path.name)
    except stack_file.StackFileError as error:
        raise PromotionRefused([str(error)], what) from None
    _settle_pending(history_path(root, stack), history_text, history, parsed, dry_run, what)
    return history, parsed


def _registries(connect, deadline: Deadline) -> _Registries:
    return _Registries(connect or functools.partial(registry_api.connect, deadline=deadline))


def promote(
    source: str = "test", target: str = "prod", *, root: Path, projects: Iterable[str] = (),
    entities: Iterable[str] = (), dry_run: bool = False, backend: Optional[str] = None,
    images: Optional[dict] = None, connect: Optional[Callable[[str], registry_api.Registry]] = None,
    now: Optional[datetime] = None, timeout: Optional[float] = DEFAULT_DEADLINE_SECONDS, parallel: int = PARALLEL,
) -> Result:
    """Promote `source`'s deployed images into Pulumi.<target>.yaml (`images` overrides reading the state)."""
    deadline = Deadline(timeout)
    with _locked(root, "promotion"):
        history, parsed = _start(root, target, dry_run, "promotion")
        if images is None:
            images = state_backend.stack_output(source, IMAGES_OUTPUT, backend=backend, root=root, deadline=deadline)
        if not isinstance(images, dict):
            raise PromotionRefused([f"the {source} stack's `{IMAGES_OUTPUT}` output is not a map: {images!r}"])
        registry = registry_of(parsed)
        refs = select(images, parsed.slots, projects, entities, source, target, registry)
        record = {"action": "promote", "from": source, "to": target}
        return _apply(
            root, target, parsed, refs, record, history, dry_run=dry_run,
            registries=_registries(connect, deadline), now=now, what="promotion", parallel=parallel,
        )


def rollback(
    stack: str = "prod", *, root: Path, dry_run: bool = False,
    connect: Optional[Callable[[str], registry_api.Registry]] = None, now: Optional[datetime] = None,
    timeout: Optional[float] = DEFAULT_DEADLINE_SECONDS, parallel: int = PARALLEL,
) -> Result:
    """Restore the references the latest not-yet-rolled-back promotion replaced."""
    deadline = Deadline(timeout)
    with _locked(root, "rollback"):
        history, parsed = _start(root, stack, dry_run, "rollback")
        undone = {r.get("undoes") for r in history if r["action"] == "rollback" and state_of(r) == "done"}
        active = [r for r in history if r["action"] == "promote" and state_of(r) == "done" and r["id"] not in undone]
        if not active:
            raise PromotionRefused([f"{history_path(root, stack).name} has no promotion left to roll back"], "rollback")
        last = active[-1]
        slots = parsed.slots
        registry = registry_of(parsed, "rollback")
        problems = []
        for key, ref in last["references"].items():
            current = slots[key].value if key in slots else None
            previous = last["previous"].get(key)
            if current != ref:
                problems.append(
                    f"{key}: Pulumi.{stack}.yaml has {current!r}, not {ref!r} written by promotion {last['id']} "
                    f"({last['when']}); it changed since, so restore it by hand or promote again"
                )
            elif previous is None:
                problems.append(f"{key}: promotion {last['id']} added this image; remove its `image:` line by hand")
            elif problem := _slot_problem(key, previous, registry):
                # The history is a file anyone can edit: what it replays must meet the same rule.
                problems.append(f"{key}: the previous reference {previous!r} in promotion {last['id']}: {problem}")
        if problems:
            raise PromotionRefused(problems, "rollback")
        record = {"action": "rollback", "from": stack, "to": stack, "undoes": last["id"]}
        return _apply(
            root, stack, parsed, dict(last["previous"]), record, history, dry_run=dry_run,
            registries=_registries(connect, deadline), now=now, what="rollback", parallel=parallel,
        )
