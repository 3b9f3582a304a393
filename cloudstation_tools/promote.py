"""Promotion: copy the test stack's deployed, digest-pinned image references into the prod stack file.

    python -m infra promote --from test --to prod [--project P ...] [--entity P/E ...] [--dry-run]
                            [--moving-tag TAG]
    python -m infra rollback --stack prod [--to ID|TIME] [--force] [--dry-run] [--moving-tag TAG]

A promotion, in this order (any refusal before step 7 leaves the stack file and the history as they
were; tags added in step 6 stay, they only mark images):
1. lock the project directory (one promote or rollback at a time) and read and validate
   promotions.<to>.jsonl; a record left `pending` by a killed run is settled from the stack file;
2. parse Pulumi.<to>.yaml once, and read the test stack's `images` output from its state;
3. refuse unless every selected entity is on both sides and every test reference is digest-pinned,
   in the target stack's registry, at the entity's repository (`<prefix>/<project>/<entity>`);
4. compute the exact edit of Pulumi.<to>.yaml and validate the result as the program would;
5. fetch each manifest by digest from its registry (refuse if any is missing);
6. tag each promoted manifest `<to>-<UTC timestamp>` inside its registry (manifest bytes only, no
   layers): one GET and one PUT per image, on kept-alive connections, a bounded number of images at
   a time. A moving tag (e.g. `prod`) only with `moving_tag`: nothing deploys by it (prod deploys
   by digest), it costs one more PUT per image, and an ECR repository with immutable tags refuses
   it from the second promotion on;
7. append the record as `pending`, write the stack file atomically, mark the record `done`.

`rollback` undoes the latest promotion still in effect (or, with `to`, every promotion after the
given one), the same way, and records that too. An entity a promotion gave its first image keeps
it (there is no earlier image; prod cannot run an entity without one). Every refusal names a
remedy that works (tests/test_promote.py runs each). Registry credentials are read by
components/registry_api.py and never printed. Everything that waits on the network shares one deadline
(`timeout`, components/limits.py).
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import json
import os
import re
import shlex
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

from cloudstation_tools import stack_file, state_backend
from infra import config as stack_config
from infra.config import ConfigError
from infra.image_refs import entity_repository, is_digest_ref, reference_problem
from components import registry_api
from components.limits import DEFAULT_DEADLINE_SECONDS, Deadline

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
STAMP = "%Y%m%dT%H%M%SZ"
"""The time in a `<stack>-<time>` tag, e.g. prod-20260304T050607Z."""
TAG = re.compile(r"\A\w[\w.-]{0,127}\Z", re.ASCII)
"""A tag as registries accept it (distribution's reference grammar)."""
CLI = "python -m infra"


class PromotionRefused(Exception):
    """Nothing was changed; str() lists every reason, and the last lines say what to do."""

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
    notes: list[str] = field(default_factory=list)
    """What the run decided beyond the diff (e.g. an entity kept at its first image by a rollback)."""
    undoes: list[int] = field(default_factory=list)
    """A rollback: the promotions it undoes (newest first)."""

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


def command(*argv: str) -> str:
    """A command line to show as a remedy, in backticks (tests parse and run them)."""
    return f"`{CLI} {shlex.join(argv)}`"


def promote_command(source: str, target: str, keys: Iterable[str] = (), projects: Iterable[str] = ()) -> str:
    argv = ["promote", "--from", source, "--to", target]
    for project in projects:
        argv += ["--project", project]
    for key in keys:
        argv += ["--entity", key]
    return command(*argv)


def timestamp_tag(stack: str, when: datetime) -> str:
    return f"{stack}-{when.astimezone(timezone.utc):{STAMP}}"


# --- the history file ------------------------------------------------------------------------


def state_of(record: dict) -> str:
    return record.get("state", "done")


def undone_ids(record: dict) -> list[int]:
    """The promotions a rollback record undoes (`undoes`: a list of ids; an int in older records)."""
    undoes = record.get("undoes")
    return [undoes] if isinstance(undoes, int) else list(undoes or [])


def read_history(root: Path, stack: str, what: str = "promotion") -> list[dict]:
    """Every record of promotions.<stack>.jsonl, validated; refuses (naming the line) if any is not
    a record this tool wrote, since rollback would act on it."""
    return _read_history(history_path(root, stack), what)[1]


def active_promotions(history: list[dict]) -> list[dict]:
    """Promotions in effect: done, and not undone by a done rollback; oldest first."""
    undone = {i for r in history if r["action"] == "rollback" and state_of(r) == "done" for i in undone_ids(r)}
    return [r for r in history if r["action"] == "promote" and state_of(r) == "done" and r["id"] not in undone]


def recorded(history: list[dict]) -> dict[str, str]:
    """What the history says the stack file holds now: each key's reference from the last done
    record that wrote it."""
    current: dict[str, str] = {}
    for record in history:
        if state_of(record) == "done":
            current.update(record["references"])
    return current


def _read_history(path: Path, what: str) -> tuple[str, list[dict]]:
    if not path.is_file():
        return "", []
    text = path.read_bytes().decode("utf-8", "replace")
    records, problems, bad = [], [], []
    lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    for position, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as error:
            problems.append(f"{path.name} line {number}: not JSON ({error.msg})")
            bad.append(number)
            continue
        found = _record_problems(record, records, last=position == len(lines) - 1)
        if found:
            problems += [f"{path.name} line {number}: {p}" for p in found]
            bad.append(number)
        else:
            records.append(record)  # only valid records count as earlier ones (ids, undoes)
    if problems:
        raise PromotionRefused(problems + [
            f"remove line{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of {path} (or restore the file from "
            f"git: `git checkout -- {path.name}`), then run it again"
        ], what)
    return text, records


def _record_problems(record, earlier: list[dict], last: bool) -> list[str]:
    if not isinstance(record, dict):
        return ["not a JSON object"]
    problems = []
    previous_id = earlier[-1]["id"] if earlier else 0
    if not isinstance(record.get("id"), int) or isinstance(record.get("id"), bool) or record["id"] <= previous_id:
        problems.append(f"id {record.get('id')!r} is not a whole number above {previous_id} (ids count up)")
    if not isinstance(record.get("when"), str) or not WHEN.match(record["when"]):
        problems.append(f"when {record.get('when')!r} is not a UTC time like 2026-03-04T05:06:07Z")
    action = record.get("action")
    if action not in ("promote", "rollback"):
        problems.append(f"action {action!r} is not promote or rollback")
    references, previous = record.get("references"), record.get("previous")
    # A rollback that only kept first images writes nothing, and records that it undid them.
    if not isinstance(references, dict) or (not references and action != "rollback") or not all(
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
    if action == "rollback":
        undoes = record.get("undoes")
        ids = undone_ids(record) if isinstance(undoes, (int, list)) and not isinstance(undoes, bool) else None
        promotions = {r["id"] for r in earlier if r.get("action") == "promote"}
        if not ids or not all(isinstance(i, int) and i in promotions for i in ids):
            problems.append(f"undoes {undoes!r}, which is not an earlier promotion")
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


def _settle(path: Path, record: dict, state: str) -> None:
    """Rewrite the pending record's line with its final state, atomically (found by its id)."""
    text = stack_file.read_text(path)
    lines = text.split("\n")
    for index, line in enumerate(lines):
        try:
            found = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("id") == record["id"] and found.get("state") == "pending":
            lines[index] = json.dumps({**record, "state": state})
            stack_file.write_atomic(path, "\n".join(lines), expected=text)
            record["state"] = state
            return
    raise PromotionRefused([
        f"{path.name}: record {record['id']} is no longer there, but its change was written; "
        f"add this line back at its end, then run it again: {json.dumps({**record, 'state': state})}"
    ])


def _settle_pending(path: Path, history: list[dict], parsed: stack_file.Parsed, dry_run: bool,
                    what: str) -> None:
    """A record a killed run left pending: done if the stack file holds its references (the file
    was written), abandoned if it holds the previous ones (it was not)."""
    if not history or state_of(history[-1]) != "pending":
        return
    record = history[-1]
    current = {key: slot.value for key, slot in parsed.slots.items()}
    holds = [key in current and current[key] == ref for key, ref in record["references"].items()]
    if all(holds):
        state = "done"
    elif all(key in current and current[key] == ref for key, ref in record["previous"].items()):
        state = "abandoned"
    else:
        # Edited since the interruption. Either state is consistent from here: rollback compares
        # the file with what the history says before it changes anything.
        suggested = "done" if any(holds) else "abandoned"
        line = next(n for n, text in enumerate(stack_file.read_text(path).split("\n"), 1)
                    if text.strip() and json.loads(text).get("id") == record["id"])
        raise PromotionRefused([
            f"{path.name}: record {record['id']} ({record['action']}, {record['when']}) was interrupted, and "
            f"{parsed.source} now holds neither its references nor the previous ones (it was edited since)",
            f"set \"state\" to \"{suggested}\" on line {line} of {path}, then run it again",
        ], what)
    if dry_run:
        record["state"] = state
    else:
        _settle(path, record, state)


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
                [f"another promote or rollback is running in {root}; wait for it to finish, then run this again"], what
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
        raise PromotionRefused([
            f"{parsed.source}: {stack_file.PLATFORM}.registry is not valid: {str(error).splitlines()[0]}",
            f"fix {stack_file.PLATFORM}.registry in {parsed.source} (docs/config-reference.md lists its keys), "
            "then run it again",
        ], what) from None
    return registry.pull_host, registry.repository_prefix


def _slot_problem(key: str, ref: str, registry: tuple[str, str]) -> Optional[str]:
    project, _, entity = key.partition("/")
    return reference_problem(ref, registry[0], entity_repository(registry[1], project, entity))


def select(
    images: dict[str, str], slots: dict[str, stack_file.ImageSlot], projects: Iterable[str], entities: Iterable[str],
    source: str, target: str, registry: Optional[tuple[str, str]] = None,
) -> dict[str, str]:
    """The test references to promote, keyed `<project>/<entity>`; refuses on any problem, each
    with what to do about it.

    `registry` is the target's (pull host, prefix): each reference must be there, at its entity's
    repository, or prod would run an image from elsewhere with credentials meant for its registry."""
    projects, entities = list(projects), list(entities)
    problems: list[str] = []
    both = set(images) | set(slots)
    target_file = f"Pulumi.{target}.yaml"
    if not projects and not entities:
        keys = set(both)
    else:
        keys = set()
        known_projects = sorted({k.split("/", 1)[0] for k in both})
        for project in projects:
            found = {k for k in both if k.split("/", 1)[0] == project}
            if not found:
                instead = (difflib.get_close_matches(project, known_projects, 1) or known_projects)[:1]
                problems.append(
                    f"--project {project}: no such project in the {source} stack or {target_file} (projects: "
                    f"{', '.join(known_projects)}), e.g. "
                    + promote_command(source, target, entities, [p for p in projects if p != project] + instead)
                )
            keys |= found
        for entity in entities:
            if "/" in entity and entity in both:
                keys.add(entity)
                continue
            named = sorted(k for k in both if k.split("/", 1)[1] == entity) or \
                difflib.get_close_matches(entity, sorted(both), 1) or sorted(both)[:1]
            instead = promote_command(source, target, [e for e in entities if e != entity] + named[:1], projects)
            if "/" not in entity:
                problems.append(f"--entity {entity!r}: must be <project>/<entity>, e.g. {instead}")
            else:
                problems.append(f"--entity {entity}: no such entity in the {source} stack or {target_file} "
                                f"(entities: {', '.join(sorted(both))}), e.g. {instead}")
        # An entity of the target without an image yet must come along, or its file cannot deploy.
        imageless = [key for key in sorted(set(slots) - keys) if slots[key].value is None]
        for key in imageless:
            if key in images:
                problems.append(f"{key}: has no image in {target_file} yet ({target} cannot deploy without one) "
                                "and is not selected")
            else:
                problems.append(_missing_in_source(key, slots[key], source, target_file))
        if imageless and all(key in images for key in imageless):
            problems.append("promote them too: " + promote_command(source, target, entities + imageless, projects))
    blocked: set[str] = set()
    for key in sorted(keys):
        problem = None
        if key not in images:
            problem = _missing_in_source(key, slots[key], source, target_file)
        elif key not in slots:
            problem = (f"{key}: deployed in {source} but missing from {target_file} — add the entity to "
                       f"{stack_file.PROJECTS} there first")
        elif not is_digest_ref(images[key]):
            problem = (f"{key}: the {source} reference {images[key]!r} is not pinned by digest "
                       f"(<registry>/<repository>[:tag]@sha256:<64 hex>) — deploy {source} with this program "
                       f"(`bash scripts/up.sh {source}`), whose `{IMAGES_OUTPUT}` output pins every image by digest")
        elif registry is not None and (found := _slot_problem(key, images[key], registry)):
            problem = (f"{key}: the {source} reference {images[key]!r}: {found} — deploy {source} with the same "
                       f"registry as {target_file} (platform.registry, docs/registry.md)")
        if problem:
            problems.append(problem)
            blocked.add(key)
    if problems:
        others = sorted(keys - blocked)
        # Promoting the others only works if every blocked entity of the target keeps an image.
        if blocked and others and all(key not in slots or slots[key].value is not None for key in blocked) \
                and len(problems) == len(blocked):
            problems.append(f"or promote only the others: {promote_command(source, target, others)}")
        raise PromotionRefused(problems)
    return {key: images[key] for key in sorted(keys)}


def first_promotion_text(root: Path, images: dict[str, str], source: str = "test", target: str = "prod") -> str:
    """`Pulumi.<target>.yaml` as a promotion of every entity from `images` (a `source` stack's
    `images` output) would write it, without touching a registry or any file: for reviewing prod
    before its first promotion (`render --images-from`) and for the tests."""
    name = f"Pulumi.{target}.yaml"
    parsed = stack_file.parse(stack_file.read_text(stack_path(root, target)), name)
    refs = select(images, parsed.slots, (), (), source, target, registry_of(parsed))
    edited = stack_file.apply(parsed, refs)
    stack_file.validate(edited, root, name)
    return edited.text


def _missing_in_source(key: str, slot: stack_file.ImageSlot, source: str, target_file: str) -> str:
    where = f"{target_file} ({slot.path})"
    if slot.value is None:
        return (f"{key}: in {where} without an image, and missing from the {source} stack's `{IMAGES_OUTPUT}` "
                f"output — deploy it to {source} first (`bash scripts/up.sh {source}`), or remove the entity "
                f"from {stack_file.PROJECTS} in {target_file}")
    return (f"{key}: in {where} but missing from the {source} stack's `{IMAGES_OUTPUT}` output — deploy it to "
            f"{source} first (`bash scripts/up.sh {source}`)")


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


ACCESS_REMEDY = (
    f"check the registry credentials ({registry_api.USERNAME_ENV}, {registry_api.PASSWORD_ENV} and "
    f"{registry_api.HOST_ENV}, or the docker config; docs/promotion.md, Registry credentials) and that the "
    "registry answers, then run it again"
)


def _fetch(refs: dict[str, str], registries: _Registries, what: str, parallel: int,
           missing: Callable[[list[str]], list[str]]) -> dict[str, registry_api.Manifest]:
    """Each reference's manifest from its registry; refuses if any digest is not there (`missing`
    gives the remedy lines for those keys)."""
    images = {key: registry_api.ImageRef.parse(ref) for key, ref in refs.items()}
    try:
        clients = {key: registries(image.registry) for key, image in images.items()}
    except registry_api.RegistryError as error:
        raise PromotionRefused([str(error), ACCESS_REMEDY], what) from None
    jobs = [functools.partial(clients[key].manifest, image) for key, image in images.items()]
    manifests, problems, absent, failed = {}, [], [], False
    for (key, image), manifest in zip(images.items(), _run(jobs, parallel)):
        if isinstance(manifest, registry_api.RegistryError):
            problems.append(f"{key}: {manifest}")
            failed = True
        elif manifest is None:
            problems.append(f"{key}: {image.digest} is not in the registry ({image.registry}/{image.repository})")
            absent.append(key)
        else:
            manifests[key] = manifest
    if problems:
        raise PromotionRefused(problems + ([ACCESS_REMEDY] if failed else []) + (missing(absent) if absent else []),
                               what)
    return manifests


def _tag(changes: list[Change], manifests: dict, tags: list[str], registries: _Registries, what: str,
         parallel: int, moving_tag: Optional[str]) -> None:
    jobs, labels = [], []
    for change in changes:
        image = registry_api.ImageRef.parse(change.new)
        for tag in tags:
            jobs.append(functools.partial(registries(image.registry).tag, image, manifests[change.key], tag))
            labels.append(change.key)
    problems = [f"{key}: {error}" for key, error in zip(labels, _run(jobs, parallel)) if error is not None]
    if problems:
        # Tags already added stay (they only mark images); the stack file is not written.
        remedy = ["tags already added stay (they only mark images); once the registry accepts tags from these "
                  "credentials (push rights), run it again — the next run writes a new timestamp tag"]
        if moving_tag:
            remedy.append(f"a repository with immutable tags (ECR) refuses the moving tag {moving_tag!r} from the "
                          "second promotion on: run it again without --moving-tag")
        raise PromotionRefused(problems + remedy, what)


# --- promote and rollback ----------------------------------------------------------------------


def _tags(stack: str, when: datetime, moving_tag: Optional[str], what: str) -> list[str]:
    """`<stack>-<UTC time>`, and the moving tag only when asked for."""
    if moving_tag is not None and not TAG.match(moving_tag):
        raise PromotionRefused([f"--moving-tag {moving_tag!r} is not a valid tag (letters, digits, `_`, `.` and `-`, "
                                f"at most 128, not starting with `.` or `-`); e.g. --moving-tag {stack}"], what)
    return ([moving_tag] if moving_tag else []) + [timestamp_tag(stack, when)]


def _apply(
    root: Path, stack: str, parsed: stack_file.Parsed, refs: dict[str, str], record: dict, history: list[dict],
    *, dry_run: bool, registries: _Registries, now: Optional[datetime], what: str,
    parallel: int, moving_tag: Optional[str], missing: Callable[[list[str]], list[str]],
    record_unchanged: bool = False, notes: Iterable[str] = (),
) -> Result:
    path = stack_path(root, stack)
    slots = parsed.slots
    changes = [Change(k, slots[k].path, slots[k].value, ref) for k, ref in refs.items() if slots[k].value != ref]
    try:
        edited = stack_file.apply(parsed, {c.key: c.new for c in changes})
        stack_file.validate(edited, root, path.name)
    except (ConfigError, stack_file.StackFileError) as error:  # the edit would not be a valid stack file
        raise PromotionRefused([str(error), f"fix that in {path.name}, then run it again"], what) from None
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    tags = _tags(stack, when, moving_tag, what)
    result = Result(path, changes, parsed.text, edited.text, tags, dry_run, notes=list(notes),
                    undoes=list(record.get("undoes", [])))
    manifests = _fetch({c.key: c.new for c in changes}, registries, what, parallel, missing)
    if dry_run or not (changes or record_unchanged):
        result.stats = registries.stats()
        return result
    history_file = history_path(root, stack)
    result.record = {
        "id": (history[-1]["id"] if history else 0) + 1,
        "when": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **record,
        "references": {c.key: c.new for c in changes},
        "previous": {c.key: c.previous for c in changes},
        "tags": tags if changes else [],
        "state": "pending" if changes else "done",
    }
    if not changes:
        # A rollback that only kept first images: nothing to write or tag, but the promotions it
        # undid are undone (the next rollback goes further back).
        _append(history_file, result.record)
        return result
    _tag(changes, manifests, tags, registries, what, parallel, moving_tag)
    # The record goes first: a run killed after the rename below still has it, and the next run
    # settles it from the file (_settle_pending).
    _append(history_file, result.record)
    stack_file.write_atomic(path, edited.text, expected=parsed.text)
    _settle(history_file, result.record, "done")
    result.stats = registries.stats()
    return result


def _start(root: Path, stack: str, dry_run: bool, what: str, flag: str):
    """Under the lock: the validated history (a pending record settled) and the parsed stack file."""
    path = stack_path(root, stack)
    if not path.is_file():
        stacks = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
        raise PromotionRefused([f"no {path.name} in {root}: {flag} names the stack whose file is edited "
                                f"(stack files here: {', '.join(stacks) or 'none'})"], what)
    _, history = _read_history(history_path(root, stack), what)
    try:
        parsed = stack_file.parse(stack_file.read_text(path), path.name)
    except stack_file.StackFileError as error:
        raise PromotionRefused([str(error), f"fix {path.name}, then run it again"], what) from None
    _settle_pending(history_path(root, stack), history, parsed, dry_run, what)
    return history, parsed


def _registries(connect, deadline: Deadline) -> _Registries:
    return _Registries(connect or functools.partial(registry_api.connect, deadline=deadline))


def promote(
    source: str = "test", target: str = "prod", *, root: Path, projects: Iterable[str] = (),
    entities: Iterable[str] = (), dry_run: bool = False, backend: Optional[str] = None,
    images: Optional[dict] = None, connect: Optional[Callable[[str], registry_api.Registry]] = None,
    now: Optional[datetime] = None, timeout: Optional[float] = DEFAULT_DEADLINE_SECONDS, parallel: int = PARALLEL,
    moving_tag: Optional[str] = None,
) -> Result:
    """Promote `source`'s deployed images into Pulumi.<target>.yaml (`images` overrides reading the state)."""
    deadline = Deadline(timeout)
    with _locked(root, "promotion"):
        history, parsed = _start(root, target, dry_run, "promotion", "--to")
        if images is None:
            images = state_backend.stack_output(source, IMAGES_OUTPUT, backend=backend, root=root, deadline=deadline)
        if not isinstance(images, dict):
            raise PromotionRefused([
                f"the {source} stack's `{IMAGES_OUTPUT}` output is not a map: {images!r} — deploy {source} with this "
                f"program (`bash scripts/up.sh {source}`), whose `{IMAGES_OUTPUT}` output is a plain map"
            ])
        registry = registry_of(parsed)
        refs = select(images, parsed.slots, projects, entities, source, target, registry)

        def missing(keys: list[str]) -> list[str]:
            remedy = [f"push those images to the registry again: deploy {source} (`bash scripts/up.sh {source}`)"]
            others = sorted(set(refs) - set(keys))
            if others and all(parsed.slots[key].value is not None for key in keys):
                remedy.append(f"or promote only the others: {promote_command(source, target, others)}")
            return remedy

        record = {"action": "promote", "from": source, "to": target}
        return _apply(
            root, target, parsed, refs, record, history, dry_run=dry_run,
            registries=_registries(connect, deadline), now=now, what="promotion", parallel=parallel,
            moving_tag=moving_tag, missing=missing,
        )


def _parse_time(value: str, stack: str) -> Optional[datetime]:
    """A UTC time as records (`2026-03-04T05:06:07Z`) or tags (`[<stack>-]20260304T050607Z`) write it."""
    text = value[len(stack) + 1:] if value.startswith(f"{stack}-") else value
    for form in ("%Y-%m-%dT%H:%M:%SZ", STAMP):
        try:
            return datetime.strptime(text, form).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def _anchor(to: str, history: list[dict], active: list[dict], stack: str) -> dict:
    """The promotion `--to` names (an id, a record's time or a `<stack>-<time>` tag): one in effect."""
    listing = ", ".join(f"{r['id']} ({r['when']})" for r in active)
    example = command("rollback", "--stack", stack, "--to", str(active[0]["id"]))
    if to.isdigit():
        found = next((r for r in history if r["id"] == int(to)), None)
        if found is not None and found in active:
            return found
        why = ("no such record" if found is None else f"record {to} is a rollback" if found["action"] == "rollback"
               else f"promotion {to} is not in effect (rolled back or abandoned)")
    else:
        when = _parse_time(to, stack)
        if when is None:
            why = "not a promotion id, a UTC time like 2026-03-04T05:06:07Z or a tag like " \
                  f"{stack}-20260304T050607Z"
        else:
            earlier = [r for r in active if _parse_time(r["when"], stack) <= when]
            if earlier:
                return earlier[-1]
            why = f"no promotion in effect at or before {when:%Y-%m-%dT%H:%M:%SZ}"
    raise PromotionRefused([f"--to {to}: {why}; promotions in effect: {listing} — e.g. {example}"], "rollback")


def rollback(
    stack: str = "prod", *, root: Path, dry_run: bool = False, to: Optional[Union[str, int]] = None,
    force: bool = False, connect: Optional[Callable[[str], registry_api.Registry]] = None,
    now: Optional[datetime] = None, timeout: Optional[float] = DEFAULT_DEADLINE_SECONDS, parallel: int = PARALLEL,
    moving_tag: Optional[str] = None,
) -> Result:
    """Undo the latest promotion still in effect, or with `to` (a promotion id, time or tag) every
    promotion after that one: restore the references they replaced.

    An entity one of them gave its first image keeps it (there is none to go back to, and prod cannot
    run an entity without one). References edited by hand since are refused unless `force`."""
    deadline = Deadline(timeout)
    with _locked(root, "rollback"):
        history, parsed = _start(root, stack, dry_run, "rollback", "--stack")
        active = active_promotions(history)
        name = f"Pulumi.{stack}.yaml"
        if not active:
            source = next((r.get("from") for r in reversed(history) if r["action"] == "promote"), "test")
            raise PromotionRefused([
                f"{history_path(root, stack).name} has no promotion left to roll back; to change the images of "
                f"{name}, promote: {promote_command(source, stack)}"
            ], "rollback")
        if to is None:
            undo = [active[-1]]
        else:
            anchor = _anchor(str(to), history, active, stack)
            undo = [r for r in reversed(active) if r["id"] > anchor["id"]]
        slots = parsed.slots
        registry = registry_of(parsed, "rollback")
        now_recorded = recorded(history)
        source = undo[0].get("from", "test") if undo else "test"
        targets: dict[str, str] = {}
        notes, problems = [], []
        for promotion in reversed(undo):  # oldest first: the earliest promotion of a key says what it had
            for key, ref in promotion["references"].items():
                if key in targets:
                    continue
                previous = promotion["previous"].get(key)
                if key not in slots:
                    notes.append(f"{key}: no longer in {name}; left out")
                    targets[key] = None
                elif previous is None:
                    notes.append(f"{key}: kept at its first image {ref} — promotion {promotion['id']} gave it, there "
                                 f"is none to go back to (to stop deploying it, remove the entity from "
                                 f"{stack_file.PROJECTS} in {name})")
                    targets[key] = ref
                else:
                    targets[key] = previous
        targets = {key: ref for key, ref in targets.items() if ref is not None}
        for key, previous in sorted(targets.items()):
            current, expected = slots[key].value, now_recorded.get(key)
            if current == previous:
                continue
            if current != expected and not force:
                problems.append(
                    f"{key}: {name} has {current!r}, but the history's last record for it wrote {expected!r}: it "
                    f"was edited since — put that back, or roll back anyway, replacing the edit (the rollback "
                    f"record keeps it as `previous`): "
                    + command("rollback", "--stack", stack, *(["--to", str(to)] if to is not None else []), "--force")
                )
            elif found := _slot_problem(key, previous, registry):
                # The history is a file anyone can edit, and the registry may have moved since:
                # what it replays must meet the same rule as any image of this stack.
                promotion = next(p for p in reversed(undo) if key in p["references"])
                problems.append(
                    f"{key}: the previous reference {previous!r} in promotion {promotion['id']}: {found} — it cannot "
                    f"be restored; promote what {source} runs instead: {promote_command(source, stack, [key])}"
                )
        if problems:
            raise PromotionRefused(problems, "rollback")
        if not undo:
            notes.append(f"promotion {anchor['id']} is the latest in effect; nothing after it to roll back")
            return Result(stack_path(root, stack), [], parsed.text, parsed.text, [], dry_run, notes=notes)

        def missing(keys: list[str]) -> list[str]:
            return [f"those images are gone from the registry; promote what {source} runs instead: "
                    f"{promote_command(source, stack, keys)}"]

        record = {"action": "rollback", "from": stack, "to": stack, "undoes": [r["id"] for r in undo]}
        return _apply(
            root, stack, parsed, targets, record, history, dry_run=dry_run,
            registries=_registries(connect, deadline), now=now, what="rollback", parallel=parallel,
            moving_tag=moving_tag, missing=missing, record_unchanged=True, notes=notes,
        )
