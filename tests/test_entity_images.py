"""Per-entity images: .dockerignore matching, the content-hash tag, generated Dockerfiles, the
EntityImage component, and the images both stack files build (test) or deploy as given (prod)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pulumi
import pytest

from components.entity_image import (
    EntityImage,
    EntityImageArgs,
    content_tag,
    context_files,
    generated_dockerfile,
    is_excluded,
    parse_dockerignore,
    pull_ref,
)
from infra import config as stack_config
from infra import delivery, versions
from cloudstation_tools import render
from infra.config import DIGEST_REF
from infra.engine_paths import program_dir
from cloudstation_tools.mocks import is_wrapped_secret
from cloudstation_tools.render import ROOT
from tests import stacks, unpinned

DOCKER_IMAGE = "docker:index/image:Image"


# --- .dockerignore ----------------------------------------------------------------------------


def test_dockerignore_drops_comments_and_blank_lines_and_cleans_patterns():
    patterns = parse_dockerignore("# comment\n\n  node_modules  \n!/keep/./me.txt\n/abs/\n ! spaced\n")
    assert [(p.text, p.negated) for p in patterns] == [
        ("node_modules", False), ("keep/me.txt", True), ("abs", False), ("spaced", True),
    ]


@pytest.mark.parametrize(
    "rules, path, excluded",
    [
        ("node_modules", "node_modules/a/b.js", True),          # a parent directory matches
        ("node_modules", "src/node_modules/a.js", False),       # anchored at the context root
        ("**/node_modules", "src/node_modules/a.js", True),     # ** spans directories
        ("**/node_modules", "node_modules/a.js", True),         # ... including none
        ("*.md", "README.md", True),
        ("*.md", "docs/guide.md", False),                       # * does not cross '/'
        ("**/*.md", "docs/deep/guide.md", True),
        ("docs/**", "docs/a/b.txt", True),
        ("a/*/c", "a/b/c", True),
        ("a/*/c", "a/b/x/c", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[a-c].txt", "b.txt", True),
        ("[^a-c].txt", "b.txt", False),
        ("*.md\n!README.md", "README.md", False),               # negation re-includes ...
        ("*.md\n!README.md", "NOTES.md", True),
        ("!README.md\n*.md", "README.md", True),                # ... but the last match wins
        ("build\n!build/keep.txt", "build/keep.txt", False),    # re-include inside an excluded dir
        ("build\n!build/keep.txt", "build/other.txt", True),
        ("test.*", "test.js", True),
        ("test.*", "testXjs", False),                           # '.' is literal
        (".git", ".git/config", True),
    ],
)
def test_dockerignore_matches_like_docker(rules, path, excluded):
    assert is_excluded(path, parse_dockerignore(rules)) is excluded


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


ENTITY = {
    "package.json": '{"name": "cart", "main": "src/index.js"}',
    "src/index.js": "console.log('cart')",
    "src/index.test.js": "test()",
    "node_modules/dep/index.js": "module.exports = 1",
    "notes/todo.md": "later",
    "notes/keep.md": "kept",
    "Dockerfile": "FROM scratch\n",
    ".dockerignore": "node_modules\n**/*.test.js\nnotes\n!notes/keep.md\n",
}


def test_context_files_are_exactly_what_dockerignore_keeps(tmp_path):
    context = write_tree(tmp_path / "cart", ENTITY)
    assert context_files(context) == [
        ".dockerignore", "Dockerfile", "notes/keep.md", "package.json", "src/index.js",
    ]


# --- content-hash tags ------------------------------------------------------------------------


@pytest.fixture
def two_entities(tmp_path):
    cart = write_tree(tmp_path / "cart", ENTITY)
    likes = write_tree(tmp_path / "likes", {**ENTITY, "package.json": '{"name": "likes"}'})
    return cart, likes


def tags(*contexts: Path) -> list[str]:
    return [content_tag(context, (context / "Dockerfile").read_text()) for context in contexts]


def test_tag_is_a_stable_hex_content_hash(two_entities):
    cart, likes = two_entities
    first = tags(cart, likes)
    assert all(re.fullmatch(r"[0-9a-f]{32}", tag) for tag in first)
    assert first[0] != first[1]
    os.utime(cart / "src/index.js", (1, 1))  # timestamps are not content
    assert tags(cart, likes) == first


@pytest.mark.parametrize(
    "change",
    [
        lambda c: (c / "src/index.js").write_text("console.log('changed')"),
        lambda c: (c / "src/new.js").write_text("new"),
        lambda c: (c / "src/index.js").rename(c / "src/main.js"),
        lambda c: (c / "src/index.js").chmod(0o755),
        lambda c: (c / "Dockerfile").write_text("FROM scratch\nUSER 1000\n"),
        lambda c: (c / "notes/keep.md").write_text("re-included, so it counts"),
    ],
    ids=["edit", "add", "rename", "chmod+x", "dockerfile", "negated-file"],
)
def test_a_changed_entity_changes_only_its_own_tag(two_entities, change):
    cart, likes = two_entities
    before = tags(cart, likes)
    change(cart)
    after = tags(cart, likes)
    assert after[0] != before[0]
    assert after[1] == before[1]


@pytest.mark.parametrize(
    "change",
    [
        lambda c: (c / "node_modules/dep/index.js").write_text("changed"),
        lambda c: (c / "src/index.test.js").write_text("changed"),
        lambda c: (c / "notes/todo.md").write_text("changed"),
        lambda c: (c / "node_modules/other.js").write_text("new"),
    ],
    ids=["ignored-dir", "ignored-glob", "ignored-parent", "ignored-new-file"],
)
def test_a_file_excluded_by_dockerignore_does_not_change_the_tag(two_entities, change):
    cart, _ = two_entities
    before = tags(cart)
    change(cart)
    assert tags(cart) == before


def test_the_dockerfile_text_is_part_of_the_tag_even_when_generated(tmp_path):
    context = write_tree(tmp_path / "e", {"index.js": "x"})
    node = generated_dockerfile("javascript", delivery.base_images(None))
    java = generated_dockerfile("java", delivery.base_images(None))
    assert content_tag(context, node) != content_tag(context, java)


# --- generated Dockerfiles --------------------------------------------------------------------


@pytest.mark.parametrize("language, base", [("javascript", "node-cloudstate-build"), ("javascript", "node-cloudstate"), ("java", "maven"), ("java", "java-runtime")])
def test_generated_dockerfiles_use_the_pinned_base_images(language, base):
    text = generated_dockerfile(language, delivery.base_images(None))
    from_lines = [line.removesuffix(" AS build") for line in text.splitlines() if line.startswith("FROM ")]
    assert f"FROM {versions.IMAGES[base]}" in from_lines
    assert "latest" not in text
    assert "USER 1000" in text  # numeric, so runAsNonRoot can be verified


def test_the_generated_javascript_dockerfile_tests_in_a_stage_the_image_depends_on():
    from tests.test_entities import depends_on, reached, stage_names, stages

    for mirror in (None, "mirror.example:5000/hub"):
        text = generated_dockerfile("javascript", delivery.base_images(mirror))
        names = stage_names(text)
        test_stage = stages(text)[names.index("test")]
        assert test_stage[0][1].split()[0] == versions.image("node-test", mirror)
        assert any(keyword == "RUN" and rest.startswith("node --test &&") for keyword, rest in test_stage)
        assert "test" in reached(depends_on(text), names[-1])


def test_the_generated_java_dockerfile_runs_the_tests():
    """`mvn package` runs the test phase first unless told to skip it; the image depends on that stage."""
    from tests.test_entities import depends_on, reached, stage_names, stages

    text = generated_dockerfile("java", delivery.base_images(None))
    assert not re.search(r"-DskipTests|-Dmaven\.test\.skip|-Dmaven\.test\.failure\.ignore|testFailureIgnore", text)
    names = stage_names(text)
    runs = [rest for keyword, rest in stages(text)[names.index("build")] if keyword == "RUN"]
    assert any(re.match(r"mvn -B( -q)? package\b", rest) for rest in runs), runs
    assert "build" in reached(depends_on(text), names[-1])


def test_generated_dockerfiles_follow_the_image_mirror():
    text = generated_dockerfile("javascript", delivery.base_images("mirror.example:5000/hub"))
    assert "FROM mirror.example:5000/hub/library/node:" in text


def test_no_generated_dockerfile_for_other_languages():
    with pytest.raises(ValueError, match="javascript, java"):
        generated_dockerfile("go", delivery.base_images(None))


def entity_config(tmp_path, language: str, files: dict[str, str]) -> dict:
    write_tree(tmp_path / "entities/p/e", files)
    return {
        "cloudstation:environment": "test",
        "cloudstation:projects": [
            {"name": "p", "entities": [{"name": "e", "kind": "action", "language": language, "source": "entities/p/e"}]}
        ],
        "cloudstation:platform": unpinned.opt_out({
            "projectState": {"image": "localhost:32000/platform/project-state@sha256:" + "1" * 64},
            "builds": {"publicEgress": {"enabled": True}}}),
    }


def test_config_requires_a_dockerfile_for_languages_without_a_generated_one(tmp_path):
    raw = entity_config(tmp_path, "go", {"main.go": "package main"})
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(raw, root=tmp_path)
    assert str(error.value).splitlines()[1].strip() == (
        "cloudstation:projects[0].entities[0].language: 'go' — entities/p/e/Dockerfile not found: "
        "a Dockerfile is generated only for javascript, java; add one to the source directory"
    )
    (tmp_path / "entities/p/e/Dockerfile").write_text("FROM scratch\n")
    assert stack_config.load(raw, root=tmp_path).projects[0].entities[0].language.value == "go"


def test_config_accepts_javascript_and_java_without_a_dockerfile(tmp_path):
    for language in ("javascript", "java"):
        assert stack_config.load(entity_config(tmp_path, language, {"x": "y"}), root=tmp_path)


def test_the_project_name_platform_is_reserved_for_project_state():
    values = stacks.read("test").values
    values["cloudstation:projects"] = values["cloudstation:projects"].replace('"name": "shop"', '"name": "platform"')
    with pytest.raises(stack_config.ConfigError, match=r"projects\[0\]\.name: 'platform' — 'platform' is reserved"):
        stacks.load(values)


# --- the component and entity_images under mocks ----------------------------------------------


def test_pull_ref_keeps_the_pull_host_repository_tag_and_digest():
    digest = "sha256:" + "a" * 64
    assert pull_ref("localhost:32000", "shop/cart", "t1", f"push.example/shop/cart@{digest}") == (
        f"localhost:32000/shop/cart:t1@{digest}"
    )
    with pytest.raises(ValueError):
        pull_ref("localhost:32000", "shop/cart", "t1", "push.example/shop/cart:t1")


def test_entity_image_builds_and_pushes_under_the_push_host_and_returns_the_pull_ref(mocked):
    args = EntityImageArgs(
        context="entities/shop/cart", dockerfile="entities/shop/cart/Dockerfile", repository="shop/cart", tag="abc",
        push_host="registry.example.com", pull_host="localhost:32000", username="u",
        password=pulumi.Output.secret("p"), platform="linux/arm64",
    )

    @pulumi.runtime.test
    def check():
        image = EntityImage("image-shop-cart", args)

        def verify(ref):
            (built,) = [r for r in mocked.registrations if r.type == DOCKER_IMAGE]
            assert built.name == "image-shop-cart-image"
            assert built.inputs["imageName"] == "registry.example.com/shop/cart:abc"
            assert built.inputs["build"] == {
                "context": "entities/shop/cart", "dockerfile": "entities/shop/cart/Dockerfile", "platform": "linux/arm64",
            }
            assert is_wrapped_secret(built.inputs["registry"])  # it holds the password
            assert built.inputs["registry"]["value"] == {
                "server": "registry.example.com", "username": "u", "password": "p",
            }
            assert DIGEST_REF.match(ref) and ref.startswith("localhost:32000/shop/cart:abc@sha256:")

        return image.ref.apply(verify)

    check()


def test_entity_image_omits_the_platform_unless_one_is_set(mocked):
    """No platform: pulumi-docker 5.2.0 builds for the machine running `pulumi up` (its Check sets
    an unset build.platform to linux/<GOARCH>), so arm64 hosts build arm64 images."""
    args = EntityImageArgs(
        context="../entities/shop/cart", dockerfile="../entities/shop/cart/Dockerfile", repository="shop/cart",
        tag="abc", push_host="localhost:32000", pull_host="localhost:32000", username="u", password="p",
    )

    @pulumi.runtime.test
    def check():
        image = EntityImage("image-shop-cart", args)

        def verify(_):
            (built,) = [r for r in mocked.registrations if r.type == DOCKER_IMAGE]
            assert built.inputs["build"] == {"context": "../entities/shop/cart", "dockerfile": "../entities/shop/cart/Dockerfile"}

        return image.ref.apply(verify)

    check()


def registry_values(**registry) -> dict:
    values = stacks.read("test").values
    platform = json.loads(values["cloudstation:platform"])
    platform["registry"] = {**platform.get("registry", {}), **registry}
    if "buildPlatform" in registry:
        platform["builds"] = {"mode": "local"}  # pulumi-docker's setting (armada refuses it: docs/builds.md)
    return {**values, "cloudstation:platform": json.dumps(platform)}


def test_build_platform_defaults_to_unset():
    assert stacks.validate_config("test").platform.registry.build_platform is None
    assert stacks.load(registry_values()).platform.registry.build_platform is None


@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64", "linux/arm/v7", "linux/riscv64"])
def test_build_platform_accepts_os_arch_and_variant(platform):
    config = stacks.load(registry_values(buildPlatform=platform))
    assert config.platform.registry.build_platform == platform


@pytest.mark.parametrize("platform", ["amd64", "linux/amd64,linux/arm64", "Linux/ARM64", "linux/arm/v7/x", "", "linux/"])
def test_a_bad_build_platform_is_a_config_error_naming_the_key(platform):
    with pytest.raises(stack_config.ConfigError) as error:
        stacks.load(registry_values(buildPlatform=platform))
    [problem] = error.value.problems
    assert problem.startswith(f"cloudstation:platform.registry.buildPlatform: {platform!r} — must be one platform os/arch[/variant]")


_LOCAL: dict = {}


def local_test_render() -> render.Rendered:
    """The test stack with `platform.builds.mode: local`: pulumi-docker builds, as before in-cluster
    builds (tests/test_builds_program.py covers `armada`, the default where Armada runs)."""
    if "test" not in _LOCAL:
        _LOCAL["test"] = stacks.render("test", stack_file=local_stack_file())
    return _LOCAL["test"]


def local_stack_file(values: dict | None = None) -> render.StackFile:
    stack_file = stacks.read("test")
    if values is not None:
        stack_file.values = values
    platform = json.loads(stack_file.values["cloudstation:platform"])
    stack_file.values["cloudstation:platform"] = json.dumps({**platform, "builds": {"mode": "local"}})
    return stack_file


def test_a_set_build_platform_reaches_every_image():
    stack_file = local_stack_file(registry_values(buildPlatform="linux/arm64"))
    rendered = stacks.render("test", stack_file=stack_file)
    builds = [r.inputs["build"] for r in rendered.of_type(DOCKER_IMAGE)]
    assert builds and {build.get("platform") for build in builds} == {"linux/arm64"}


def test_generated_dockerfiles_are_written_outside_the_context_at_a_stable_path(tmp_path):
    raw = entity_config(tmp_path, "javascript", {"index.js": "x"})
    config = stack_config.load(raw, root=tmp_path)
    entity = config.projects[0].entities[0]
    path, text = delivery.entity_dockerfile(tmp_path, "p", entity, None)
    assert path == ".cloudstation/dockerfiles/p-e.Dockerfile"
    assert (tmp_path / path).read_text() == text
    assert not (tmp_path / "entities/p/e/Dockerfile").exists()  # the context is unchanged
    assert delivery.entity_dockerfile(tmp_path, "p", entity, None) == (path, text)


# --- the rendered graph of both stack files ---------------------------------------------------


def entity_keys(config: stack_config.StackConfig) -> set[str]:
    return {f"{project}/{entity.name}" for project, entity in delivery.all_entities(config)}


def test_test_stack_builds_one_image_per_entity_and_prod_builds_none(rendered):
    config = stacks.validate_config(rendered.stack)
    if rendered.stack == "test":
        rendered = local_test_render()
    built = {r.name for r in rendered.of_type(DOCKER_IMAGE)}
    if rendered.stack == "test":
        assert built == {f"image-{key.replace('/', '-')}-image" for key in entity_keys(config)}
        assert "image-platform-project-state-image" in built
        # The stack files set no buildPlatform: pulumi-docker builds for the host's platform.
        assert all("platform" not in r.inputs["build"] for r in rendered.of_type(DOCKER_IMAGE))
    else:
        assert built == set()
        assert rendered.of_type("cloudstation:delivery:EntityImage") == []


def test_images_output_is_every_entity_digest_pinned_on_the_pull_host(rendered):
    config = stacks.validate_config(rendered.stack)
    images = rendered.outputs["images"]
    assert set(images) == entity_keys(config)
    pull_host = rendered.outputs["registry"]["pullHost"]
    for key, ref in images.items():
        assert DIGEST_REF.match(ref), ref
        assert ref.startswith(f"{pull_host}/{key}:"), ref


def test_test_stack_tags_are_the_content_hash_of_each_source(rendered_stacks):
    rendered = local_test_render()
    config = stacks.validate_config("test")
    for project, entity in delivery.all_entities(config):
        _, text = delivery.entity_dockerfile(ROOT, project, entity, config.platform.image_mirror)
        tag = content_tag(ROOT / entity.source, text)
        (built,) = [r for r in rendered.of_type(DOCKER_IMAGE) if r.name == f"image-{project}-{entity.name}-image"]
        assert built.inputs["imageName"].endswith(f"/{project}/{entity.name}:{tag}")
        # Relative to the program's directory, where the engine starts pulumi-docker (infra/engine_paths.py).
        context = built.inputs["build"]["context"]
        assert not os.path.isabs(context)
        assert Path(os.path.normpath(program_dir(ROOT) / context)) == ROOT / entity.source
        dockerfile = Path(os.path.normpath(program_dir(ROOT) / built.inputs["build"]["dockerfile"]))
        assert dockerfile.read_text() == text
        assert rendered.outputs["images"][f"{project}/{entity.name}"].split("@")[0].endswith(f":{tag}")


def test_in_cluster_build_tags_hash_the_source_and_the_builder(rendered_stacks):
    """Issue 19 defect 3: an in-cluster build's tag is the content hash of its source, Dockerfile
    and builder, the same value as its EntityBuild's `builder` input (infra/builds.py `builder`),
    so a builder bump is a new tag the registry lacks, and the provider builds it."""
    from components import build_job

    config = stacks.validate_config("test")
    assert config.platform.build_mode == "armada"
    builder = config.platform.builds.rebuild_key()
    assert builder == build_job.builder_key(versions.image(build_job.BUILDER_IMAGE), versions.image(build_job.FETCH_IMAGE))
    builds = {r.name: r for r in rendered_stacks["test"].registrations if r.type.endswith("dynamic/builds:EntityBuild")}
    for project, entity in delivery.all_entities(config):
        _, text = delivery.entity_dockerfile(ROOT, project, entity, config.platform.image_mirror)
        build = builds[f"build-{project}-{entity.name}-build"]
        assert build.inputs["builder"] == builder
        assert build.inputs["contentTag"] == content_tag(ROOT / entity.source, text, builder)
    source = ROOT / config.projects[0].entities[0].source
    text = (source / "Dockerfile").read_text() if (source / "Dockerfile").is_file() else "FROM x\n"
    bumped = {**builder, "image": builder["image"].split("@")[0] + "-bumped"}
    assert len({content_tag(source, text), content_tag(source, text, builder), content_tag(source, text, bumped),
                content_tag(source, text, {**builder, "fetchImage": "other"})}) == 4
    assert content_tag(source, text, dict(reversed(list(builder.items())))) == content_tag(source, text, builder)


def test_prod_deploys_exactly_the_images_of_its_stack_file(rendered_stacks):
    config = stacks.validate_config("prod")
    images = rendered_stacks["prod"].outputs["images"]
    assert images == {f"{project}/{entity.name}": entity.image for project, entity in delivery.all_entities(config)}


def test_a_test_entity_with_an_image_is_not_built():
    stack_file = stacks.read("test")
    given = "localhost:32000/shop/cart:given@sha256:" + "b" * 64
    stack_file.values["cloudstation:projects"] = stack_file.values["cloudstation:projects"].replace(
        '"source": "entities/shop/cart"', f'"source": "entities/shop/cart", "image": "{given}"'
    )
    rendered = stacks.render("test", stack_file=stack_file)
    assert "image-shop-cart-image" not in {r.name for r in rendered.of_type(DOCKER_IMAGE)}
    assert rendered.outputs["images"]["shop/cart"] == given


def test_prod_names_every_entity_without_an_image():
    stack_file = stacks.read("prod")
    stack_file.values["cloudstation:projects"] = re.sub(
        r', "image": "[^"]+"', "", stack_file.values["cloudstation:projects"], count=1
    )
    with pytest.raises(stack_config.ConfigError, match=r"projects\[0\]\.entities\[0\]\.image: \(not set\) — a prod entity"):
        stacks.render("prod", stack_file=stack_file)
