"""Every entity below entities/ (the repository's, and a user's own, whether or not a stack file
names it yet): each meets the container contract, its base images are the pins of
infra/versions.py, and its .dockerignore keeps exactly what goes into the image. An entity without
a Dockerfile is checked with the one the program generates for it, and one with its own Dockerfile
in a language the program generates one for is checked with the generated one too (a copy of it
without its Dockerfile, as docs/operations.md's new project has, builds with that). The entities'
own logic is tested with `node --test` (scripts/test.sh). No stack file of the user's is read: the
directories say which entities there are."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from components.entity_image import DOCKERFILE, GENERATED_LANGUAGES, context_files, generated_dockerfile
from infra.delivery import base_images
from infra.config import DIGEST_REF, Language
from tests.stacks import validate_config  # the base fixture pair, prod as its first promotion writes it
from infra.versions import IMAGES, digest_of, tag_of
from tests.conftest import ROOT, STACKS

EXACT_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
# Syntax and APIs newer than the images' Node 12 (ES2019).
NEWER_THAN_NODE12 = re.compile(r"\?\.|\?\?|\.at\(|\.replaceAll\(|Object\.hasOwn|structuredClone|^\s*import\s", re.M)


def entity_directories() -> set[str]:
    """Every directory below entities/ that holds an entity: a .proto beside a Dockerfile or package.json."""
    return {
        path.parent.relative_to(ROOT).as_posix()
        for path in (ROOT / "entities").rglob("*.proto")
        if "node_modules" not in path.parts
        and ((path.parent / DOCKERFILE).is_file() or (path.parent / "package.json").is_file())
    }


def language_of(directory: Path) -> str:
    """An entity directory's language as far as these checks need it: `javascript` (a package.json),
    `java` (a Maven or Gradle build), else "" (another language, which brings its own Dockerfile)."""
    if (directory / "package.json").is_file():
        return "javascript"
    if any((directory / name).is_file() for name in ("pom.xml", "build.gradle", "build.gradle.kts")):
        return "java"
    return ""


LANGUAGES = {source: language_of(ROOT / source) for source in sorted(entity_directories())}
"""Every entity directory below entities/ and its language, read from its files."""
ENTITY_DIRS = list(LANGUAGES)
JAVASCRIPT_DIRS = [source for source, language in LANGUAGES.items() if language == "javascript"]


def builds(languages: tuple[str, ...] | None = None) -> list:
    """(source, generated) of each Dockerfile an entity directory (of `languages`) builds with: the
    one the program uses (its own, else the generated one; id: the source), and for a directory
    with its own Dockerfile in a language the program generates one for, the generated one too
    (id: `<source>:generated`)."""
    found = []
    for source, language in LANGUAGES.items():
        if languages is not None and language not in languages:
            continue
        found.append(pytest.param(source, False, id=source))
        if (ROOT / source / DOCKERFILE).is_file() and language in GENERATED_LANGUAGES:
            found.append(pytest.param(source, True, id=f"{source}:generated"))
    return found


BUILDS = builds()
JAVASCRIPT_BUILDS = builds(("javascript",))


def dockerfile_text(source: str, generated: bool = False) -> str:
    """The entity's own Dockerfile, or (`generated`, or an entity without one) the one the program
    generates for it (infra/delivery.py `entity_dockerfile`; base images unmirrored)."""
    own = ROOT / source / DOCKERFILE
    if own.is_file() and not generated:
        return own.read_text()
    assert LANGUAGES[source] in GENERATED_LANGUAGES, f"{source}: no Dockerfile, and none is generated for {LANGUAGES[source]}"
    return generated_dockerfile(LANGUAGES[source], base_images(None))


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile's text, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", text)
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, in order (each starts with its FROM)."""
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions(text):
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def copy_sources(text: str) -> list[str]:
    """Build-context paths the Dockerfile COPYs or ADDs (not those copied from another stage),
    normalised: no leading `./` or trailing `/`, and `.` (the whole context) as ''."""
    sources = []
    for keyword, rest in instructions(text):
        if keyword in ("COPY", "ADD"):
            words = shlex.split(rest)
            if any(w.startswith("--from") for w in words):
                continue
            sources += [re.sub(r"^\./|^\.$", "", w).rstrip("/") for w in words[:-1] if not w.startswith("--")]
    return sources


def test_every_entity_directory_is_checked_with_the_language_its_stack_file_declares():
    """Each directory below entities/ is checked below (and by scripts/test.sh's `node --test`),
    whichever stack file names it; the language read from its files is the one the fixture
    stacks declare for the entities they share (so a user's own is checked as its kind)."""
    found = entity_directories()
    assert found, "no entity directory found below entities/"
    assert found <= set(ENTITY_DIRS)
    declared = {}
    for stack in STACKS:
        config = validate_config(stack)
        declared.update((e.source, e.language.value) for project in config.projects for e in project.entities)
        declared[config.platform.project_state.source] = config.platform.project_state.language.value
    shared = found & declared.keys()
    assert shared, "the fixture stacks build none of the entities below entities/"
    assert {source: language_of(ROOT / source) for source in shared} == {source: declared[source] for source in shared}
    # The generated Dockerfile is checked below on real entities too, whether or not one lacks its own.
    assert any(param.values[1] for param in BUILDS)


@pytest.mark.parametrize("source", ENTITY_DIRS)
def test_each_entity_has_a_dockerfile_an_ignore_file_and_its_proto(source):
    directory = ROOT / source
    # Its own Dockerfile, or a language the program generates one for (infra/config.py checks the same).
    assert (directory / DOCKERFILE).is_file() or LANGUAGES[source] in GENERATED_LANGUAGES
    assert (directory / ".dockerignore").is_file()
    # JavaScript: at the top (the Dockerfiles compile `*.proto` there); others: anywhere in the sources.
    protos = list(directory.glob("*.proto") if LANGUAGES[source] == "javascript" else directory.rglob("*.proto"))
    assert protos, f"{source} has no .proto"
    # The service with its entity key (actions have none) and the SDK's import for the option.
    keyed = [p for p in protos if "(.cloudstate.entity_key) = true" in p.read_text()]
    for proto in keyed:
        assert 'import "cloudstate/entity_key.proto";' in proto.read_text(), proto.name


@pytest.mark.parametrize(("source", "generated"), BUILDS)
def test_base_images_are_the_pins_of_versions_py(source, generated):
    # IMAGES: each pin with the digest recorded for its tag (infra/image-digests.yaml); BuildKit
    # pulls `FROM repo:tag@sha256:…` by the digest, so the base cannot change under the tag.
    pinned = set(IMAGES.values())
    names: set[str] = set()
    for stage in stages(dockerfile_text(source, generated)):
        words = stage[0][1].split()
        image = words[0]
        if image not in names:  # FROM <earlier stage> is not a base image
            assert image in pinned, f"{source}: FROM {image} is not a pin of infra/versions.py (with its digest)"
            assert tag_of(image) not in (None, "latest") and digest_of(image), f"{source}: FROM {image} needs tag and digest"
        if len(words) == 3 and words[1].upper() == "AS":
            names.add(words[2])


@pytest.mark.parametrize(("source", "generated"), BUILDS)
def test_the_image_runs_as_a_numeric_non_root_user_and_listens_on_port(source, generated):
    final = stages(dockerfile_text(source, generated))[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, f"{source}: the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} must be a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    env = " ".join(rest for keyword, rest in final if keyword == "ENV")
    assert re.search(r"\bPORT=8080\b", env), f"{source}: no ENV PORT=8080"
    assert ("EXPOSE", "8080") in final


@pytest.mark.parametrize(("source", "generated"), JAVASCRIPT_BUILDS)
def test_the_javascript_entrypoint_reads_port(source, generated):
    final = stages(dockerfile_text(source, generated))[-1]
    command = json.loads(next(rest for keyword, rest in reversed(final) if keyword == "CMD"))
    assert command[0] == "node"
    entrypoint = ROOT / source / command[1]
    if entrypoint.is_dir():  # `node .`: the package's main (Node's module resolution), else index.js
        main = json.loads((entrypoint / "package.json").read_text()).get("main", "index.js")
        entrypoint = entrypoint / main
        if entrypoint.is_dir():
            entrypoint = entrypoint / "index.js"
    assert entrypoint.is_file(), f"{source}: CMD {command} runs {entrypoint.relative_to(ROOT)}, which does not exist"
    assert "process.env.PORT" in entrypoint.read_text(), f"{command[1]} does not read PORT"


@pytest.mark.parametrize(("source", "generated"), BUILDS)
def test_the_ignore_file_keeps_exactly_what_the_image_copies(source, generated):
    directory = ROOT / source
    kept = set(context_files(directory))
    copied = copy_sources(dockerfile_text(source, generated))

    def under(path: str, copy: str) -> bool:
        return copy == "" or path == copy or path.startswith(copy + "/")

    for path in copied:
        assert any(under(k, path) for k in kept), f"COPY {path or '.'}: excluded or missing"
    unused = [k for k in kept if k not in (DOCKERFILE, ".dockerignore") and not any(under(k, c) for c in copied)]
    assert unused == [], f"{source}: hashed into the tag but never copied into the image"


@pytest.mark.parametrize("source", ENTITY_DIRS)
def test_dependencies_and_docs_stay_out_of_the_build_context_and_tests_stay_in(source, tmp_path):
    copy = tmp_path / "entity"
    shutil.copytree(ROOT / source, copy, ignore=shutil.ignore_patterns("node_modules"))
    extra = ["node_modules/grpc/index.js", "src/node_modules/x.js", "docs/guide.txt", "NOTES.md", "user-function.desc"]
    tests = ["src/new.test.js", "src/other.test.mjs"]
    for relative in [*extra, *tests]:
        (copy / relative).parent.mkdir(parents=True, exist_ok=True)
        (copy / relative).write_text("x")
    kept = context_files(copy)
    assert [k for k in kept if k in extra] == []
    # The build runs the tests (the Dockerfile's test stage), so they are part of the context and its hash.
    assert set(tests) <= set(kept)
    assert (DOCKERFILE in kept) == (copy / DOCKERFILE).is_file()


# --- the test stage: the entity's tests run inside every image build -----------------------------


def stage_names(text: str) -> list[str]:
    """The name of each stage (`FROM x AS name`), or its index as text for an unnamed one."""
    names = []
    for index, stage in enumerate(stages(text)):
        words = stage[0][1].split()
        names.append(words[2] if len(words) == 3 and words[1].upper() == "AS" else str(index))
    return names


def depends_on(text: str) -> dict[str, set[str]]:
    """Stage -> the stages it reads directly: `FROM <stage>` and `COPY --from=<stage>` (by name or index)."""
    names = stage_names(text)
    graph: dict[str, set[str]] = {}
    for name, stage in zip(names, stages(text)):
        needs = set()
        base = stage[0][1].split()[0]
        if base in names:
            needs.add(base)
        for keyword, rest in stage:
            if keyword in ("COPY", "ADD"):
                for word in shlex.split(rest):
                    if word.startswith("--from="):
                        source = word.split("=", 1)[1]
                        needs.add(names[int(source)] if source.isdigit() else source)
        graph[name] = needs
    return graph


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for needed in graph[todo.pop()] - seen:
            seen.add(needed)
            todo.append(needed)
    return seen


@pytest.mark.parametrize(("source", "generated"), JAVASCRIPT_BUILDS)
def test_a_test_stage_runs_the_tests_and_the_image_depends_on_it(source, generated):
    """BuildKit and kaniko build only the stages the target needs, so the test stage counts only if
    the final stage reaches it; its base is the "node-test" pin (Node >= 18 for `node --test`)."""
    text = dockerfile_text(source, generated)
    names = stage_names(text)
    assert "test" in names, f"{source}: no stage named test"
    test_stage = stages(text)[names.index("test")]
    assert test_stage[0][1].split()[0] == IMAGES["node-test"], f"{source}: the test stage is not FROM the node-test pin"
    runs = " ".join(rest for keyword, rest in test_stage if keyword == "RUN")
    assert re.search(r"\bnode --test\b", runs), f"{source}: the test stage does not run node --test"
    # A failing run must fail the build: no `|| true`, no `;` that would go on after a failure.
    assert "||" not in runs and ";" not in runs, runs
    assert "test" in reached(depends_on(text), names[-1]), f"{source}: the image does not depend on the test stage"


@pytest.mark.parametrize("source", [s for s in JAVASCRIPT_DIRS if (ROOT / s / DOCKERFILE).is_file()])
def test_the_test_stage_sees_what_the_tests_read_and_keeps_them_out_of_the_image(source, tmp_path):
    """Run the test stage's COPYs and `node --test` on the build context (tests/test_doc_commands-style:
    what the builder would run), and check the build stage deletes the tests before the runtime copies /app."""
    text = dockerfile_text(source)
    test_stage = stages(text)[stage_names(text).index("test")]
    context = ROOT / source
    kept = set(context_files(context))
    work = tmp_path / "app"
    work.mkdir()
    for keyword, rest in test_stage:
        if keyword == "COPY":
            *sources, _ = shlex.split(rest)
            for path in sources:
                path = path.rstrip("/")
                files = [k for k in kept if k == path or k.startswith(path + "/")]
                assert files, f"{source}: COPY {path} copies nothing of the context"
                for relative in files:
                    (work / relative).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(context / relative, work / relative)
    assert shutil.which("node"), "Node.js is required (scripts/test.sh installs it)"
    done = subprocess.run(["node", "--test"], cwd=work, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^# pass [1-9]", done.stdout, re.M), done.stdout
    build = stages(text)[stage_names(text).index("build")]
    assert any(keyword == "RUN" and "*.test.js" in rest and "-delete" in rest for keyword, rest in build), source


@pytest.mark.parametrize("source", JAVASCRIPT_DIRS)
def test_dependencies_are_exact_and_locked(source):
    directory = ROOT / source
    package = json.loads((directory / "package.json").read_text())
    lock = json.loads((directory / "package-lock.json").read_text())
    # npm 6 (the images' Node 12) reads lockfile v1/v2, not v3.
    assert lock["lockfileVersion"] in (1, 2)
    assert lock["name"] == package["name"]
    dependencies = package["dependencies"]
    assert dependencies.get("cloudstate") == "0.0.3"
    for name, version in dependencies.items():
        assert EXACT_VERSION.match(version), f"{name}: {version} is not an exact version"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    assert lock["packages"][""]["dependencies"] == dependencies


@pytest.mark.parametrize("source", JAVASCRIPT_DIRS)
def test_sources_run_on_the_images_node_12(source):
    for path in (ROOT / source).rglob("*.js"):
        if "node_modules" in path.parts or path.name.endswith(".test.js"):
            continue
        code = re.sub(r"//[^\n]*|/\*.*?\*/", "", path.read_text(), flags=re.S)
        assert not NEWER_THAN_NODE12.search(code), f"{path.relative_to(ROOT)} uses syntax newer than Node 12"


def node(script: str) -> object:
    assert shutil.which("node"), "Node.js is required (scripts/test.sh installs it)"
    done = subprocess.run(["node", "-e", script], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_project_state_knows_the_languages_of_the_stack_config():
    languages = node("console.log(JSON.stringify(require('./entities/project-state/src/project').LANGUAGES))")
    assert languages == [language.value for language in Language]


def test_project_state_accepts_the_same_image_references_as_the_stack_config():
    digest = "sha256:" + "0" * 64
    references = [
        f"localhost:5000/shop/cart@{digest}",
        f"registry.example/a/b/c:v1.2@{digest}",
        f"localhost:5000/shop/cart:{'t' * 128}@{digest}",
        "localhost:5000/shop/cart:v1",
        f"cart@{digest}",
        f"Localhost:5000/shop/cart@{digest}",
        f"localhost:5000/shop/cart@sha256:{'0' * 63}",
        f"localhost:5000/shop/cart@sha256:{'A' * 64}",
        f"localhost:5000//cart@{digest}",
    ]
    script = (
        "const { DIGEST_REF } = require('./entities/project-state/src/project');"
        f"console.log(JSON.stringify({json.dumps(references)}.map((r) => DIGEST_REF.test(r))))"
    )
    expected = [bool(DIGEST_REF.match(r)) for r in references]
    assert expected == [True, True, True, False, False, False, False, False, False]
    assert node(script) == expected
