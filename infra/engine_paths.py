"""File-system paths the program hands to providers, and the directory they are resolved from.

The engine runs the program, and starts every provider plugin, in the directory that Pulumi.yaml's
`main` names, not in the directory of Pulumi.yaml (here there is no `main`, so both are the project
root: the dynamic providers' launcher resolves `virtualenv` from that directory, see Pulumi.yaml):

- pulumi/pulumi pkg/engine/project.go `getPwdMain`: a directory `main` becomes the working
  directory (pwd) "so that any relative paths inside of the program are correct";
- pkg/engine/deployment.go `ProjectInfoContext` puts that pwd in the plugin context
  (`plugin.NewContextWithRoot(..., pwd, projinfo.Root, ...)`), and
  sdk/go/common/resource/plugin/provider_plugin.go starts each provider with `newPlugin(ctx,
  ctx.Pwd, ...)` (plugin.go `execPlugin`: `cmd.Dir = pwd`);
- the Python language host chdirs there before running the program
  (sdk/python/cmd/pulumi-language-python-exec: `os.chdir(args.pwd)`).

Providers open the paths they are given as they are, from that directory: pulumi-docker 5.2.0
provider/provider.go `Check` stats `build.dockerfile` and hashes `build.context` (`hashContext`)
during preview and up, and provider/image.go `dockerBuild` tars them (`GetContextFromLocalDir`,
`os.Open(build.Dockerfile)`); pulumi-kubernetes provider/pkg/provider/provider.go `renderYaml`
writes below `renderYamlToDirectory` (`filepath.Join(yamlDirectory, ...)`).

So every path input is relative to the program's directory (`entities/shop/cart`), computed
with `from_program`. Never absolute: an absolute path differs between checkouts, and a changed
input is a diff on every machine (pulumi-kubernetes `DiffConfig` even replaces the provider, and
so every object, when `renderYamlToDirectory` changes). Stack config stays relative to the
directory of Pulumi.yaml, where users run `pulumi`.

`PATH_INPUTS` declares which inputs are paths; `problems` checks a rendered graph against the
rules above (tests/test_engine_paths.py runs it on every stack).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Protocol

import yaml
from pulumi.runtime import rpc

PROJECT_FILE = "Pulumi.yaml"


def program_entry(root: Path) -> tuple[Path, str]:
    """(working directory, entry point) the engine uses for the project in `root`: getPwdMain's
    rules for Pulumi.yaml's `main` (unset: root and "."; a directory: it and "."; a file: its
    directory and its name; absolute or outside root: an error)."""
    project = yaml.safe_load((root / PROJECT_FILE).read_text()) or {}
    main = project.get("main") or ""
    if not main:
        return root, "."
    if os.path.isabs(main):
        raise ValueError(f"{PROJECT_FILE}: project 'main' must be a relative path, got {main!r}")
    resolved = Path(os.path.normpath(root / main))
    if resolved != root and root not in resolved.parents:
        raise ValueError(f"{PROJECT_FILE}: project 'main' must be a subfolder, got {main!r}")
    if resolved.is_dir():
        return resolved, "."
    if not resolved.exists():
        raise FileNotFoundError(f"{PROJECT_FILE}: project 'main' could not be read: {main!r}")
    return resolved.parent, resolved.name


def program_dir(root: Path) -> Path:
    """The working directory of the program and of every provider plugin (see the module doc)."""
    return program_entry(root)[0]


def from_program(path: str | Path, root: Path, cwd: Path) -> str:
    """`path` (relative to `root`, the directory of Pulumi.yaml, as stack config spells paths)
    as the program passes it to a provider: relative to `cwd`, the program's working directory,
    '/'-separated. E.g. ('entities/shop/cart', <repo>, <repo>/infra) -> '../entities/shop/cart'."""
    if Path(path).is_absolute():
        raise ValueError(f"expected a path relative to {root}, got {path!s}")
    return Path(os.path.relpath(Path(root) / path, cwd)).as_posix()


# --- the harness check ------------------------------------------------------------------------

DIRECTORY, FILE, OUTPUT_DIRECTORY, KUBECONFIG = "directory", "file", "output directory", "kubeconfig"


@dataclass(frozen=True)
class PathInput:
    type: str
    """Resource type token."""
    property: str
    """Dotted path to the input (engine camelCase), e.g. `build.context`."""
    kind: str
    """DIRECTORY / FILE must exist; OUTPUT_DIRECTORY is created by the provider (inside the
    repository, or its parent exists); KUBECONFIG is a path only when it is not kubeconfig text."""


PATH_INPUTS: tuple[PathInput, ...] = (
    PathInput("docker:index/image:Image", "build.context", DIRECTORY),
    PathInput("docker:index/image:Image", "build.dockerfile", FILE),
    PathInput("docker-build:index:Image", "context.location", DIRECTORY),
    PathInput("docker-build:index:Image", "dockerfile.location", FILE),
    # The in-cluster build's provider re-reads the context at create (components/entity_build.py).
    PathInput("pulumi-python:dynamic/builds:EntityBuild", "contextDir", DIRECTORY),
    PathInput("pulumi:providers:kubernetes", "renderYamlToDirectory", OUTPUT_DIRECTORY),
    PathInput("pulumi:providers:kubernetes", "kubeconfig", KUBECONFIG),
    PathInput("kubernetes:yaml:ConfigFile", "file", FILE),
    PathInput("kubernetes:yaml/v2:ConfigFile", "file", FILE),
    PathInput("kubernetes:yaml:ConfigGroup", "files", FILE),
    PathInput("kubernetes:yaml/v2:ConfigGroup", "files", FILE),
    PathInput("kubernetes:kustomize:Directory", "directory", DIRECTORY),
    PathInput("kubernetes:kustomize/v2:Directory", "directory", DIRECTORY),
)
"""Every input of a resource type the program could use that a provider opens as a local path."""


class Resource(Protocol):
    type: str
    name: str
    inputs: dict


def _at(inputs: Any, dotted: str) -> Any:
    value = inputs
    for part in dotted.split("."):
        value = _unwrap(value)
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return _unwrap(value)


def _unwrap(value: Any) -> Any:
    """A wire-form secret (`{<sig key>: <secret sig>, "value": ...}`, as mocks record it) to its value."""
    if isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig:
        return value.get("value")
    return value


def path_values(resources: Iterable[Resource]) -> Iterator[tuple[Resource, PathInput, str]]:
    """(resource, declared input, value) of every path input set in `resources`."""
    table: dict[str, list[PathInput]] = {}
    for entry in PATH_INPUTS:
        table.setdefault(entry.type, []).append(entry)
    for resource in resources:
        for entry in table.get(resource.type, ()):
            value = _at(resource.inputs, entry.property)
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item:
                    yield resource, entry, item


def _is_remote(value: str) -> bool:
    return "://" in value or value.startswith("git@")


def _is_kubeconfig_text(value: str) -> bool:
    return "\n" in value or value.lstrip().startswith(("{", "apiVersion:"))


def problems(
    resources: Iterable[Resource], cwd: Path, root: Path, ambient_kubeconfig: Optional[str] = None
) -> list[str]:
    """Every path input that would not resolve as the engine resolves it: absolute, or not an
    existing path inside `root` when joined to `cwd` (the program's working directory).

    `ambient_kubeconfig` is $KUBECONFIG: the Kubernetes SDK copies it into `kubeconfig` when the
    program sets none, and the provider accepts it in any mode (provider.go `CheckConfig`,
    `matchesAmbientKubeconfigEnv`); it is the user's, not the program's, so it is not checked."""
    root = Path(os.path.normpath(root))
    found = []
    for resource, entry, value in path_values(resources):
        where = f"{resource.type} {resource.name!r} {entry.property}={value!r}"
        if entry.kind == KUBECONFIG and (_is_kubeconfig_text(value) or value == ambient_kubeconfig):
            continue
        if _is_remote(value):
            continue
        if os.path.isabs(value) or value.startswith("~"):
            found.append(f"{where}: absolute; must be relative to the program's directory {cwd}")
            continue
        resolved = Path(os.path.normpath(cwd / value))
        inside = resolved == root or root in resolved.parents
        if entry.kind == OUTPUT_DIRECTORY:
            if not (inside or resolved.parent.is_dir()):
                found.append(f"{where}: resolves to {resolved}, outside the repository with no parent directory")
            continue
        if not inside:
            found.append(f"{where}: resolves to {resolved}, outside the repository {root}")
        elif entry.kind == DIRECTORY and not resolved.is_dir():
            found.append(f"{where}: no directory {resolved} (paths resolve from {cwd})")
        elif entry.kind in (FILE, KUBECONFIG) and not resolved.is_file():
            found.append(f"{where}: no file {resolved} (paths resolve from {cwd})")
    return found


def _strings(value: Any) -> Iterator[str]:
    value = _unwrap(value)
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value
