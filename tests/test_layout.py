"""The house's rooms (issue 12 item 10): the Pulumi program (infra/), its components (components/)
and the command line with its libraries (cloudstation_tools/), with one-way imports between them,
and one installable `cloudstation` command equal to `python -m infra`."""
import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# infra/versions.py stays the one place of versions (the team's rule); components read their image
# pins from it and, for the one digest-reference pattern (standard library only, written to be
# imported from anywhere), infra/image_refs.py (components/registry_api.py), and likewise for the builds'
# public-egress rule that the program, the checks and the policy pack share, infra/public_egress.py
# (components/build_job.py, components/builds_namespace.py), when an address list is open,
# infra/address_blocks.py (components/network.py), and which names and values are credentials,
# infra/credentials.py (components/armada/settings.py), and what a resource quantity is worth,
# infra/quantities.py (components/k8s.py), and the proxy annotation and operator config the checks and
# the pack read back, infra/image_pins.py (components/cloudstate_operator.py,
# components/project_environment.py); nothing else of the program.
COMPONENTS_MAY_IMPORT = {"infra.versions", "infra.image_refs", "infra.public_egress", "infra.address_blocks",
                         "infra.credentials", "infra.quantities", "infra.image_pins"}


def _imports(path: Path, package: str, *, module_level_only: bool = False) -> set[str]:
    """Modules `path` imports (absolute names; `from X import y` also counts X.y when X.y is a module
    of the scanned trees). Module level includes `if TYPE_CHECKING:` blocks: a cycle through type
    names is still a cycle for readers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = ast.walk(tree)
    if module_level_only:
        nodes = [n for stmt in tree.body for n in ([stmt] + (list(ast.walk(stmt)) if isinstance(stmt, (ast.If, ast.Try)) else []))]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> dict[str, Path]:
    return {f"{package}.{p.stem}" if p.stem != "__init__" else package: p for p in sorted((ROOT / package).glob("*.py"))}


def test_components_import_nothing_from_the_program():
    offenders = []
    for path in sorted((ROOT / "components").rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for name in _imports(path, package):
            # `from infra import versions` lists infra and infra.versions: the module names it.
            if name.startswith("infra.") and ".".join(name.split(".")[:2]) not in COMPONENTS_MAY_IMPORT:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
            if name.startswith("cloudstation_tools"):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


def test_the_program_imports_nothing_from_the_command_line():
    # `python -m infra` dispatches to the CLI from infra/__main__.py; nothing else of the program may.
    offenders = [f"{path.name}: {name}" for module, path in _modules("infra").items() if module != "infra.__main__"
                 for name in _imports(path, "infra") if name.startswith("cloudstation_tools")]
    assert not offenders, offenders


def _cycle(graph: dict[str, set[str]]):
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_among_the_program_modules():
    """Module-level imports (TYPE_CHECKING blocks included); an import inside a function runs after
    both modules loaded and is not an edge."""
    modules = {**_modules("infra"), **_modules("cloudstation_tools")}
    graph = {m: {n for n in _imports(p, m.rpartition(".")[0] or m, module_level_only=True) if n in modules and n != m}
             for m, p in modules.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # The check can fail: the circle this layout broke (program -> areas -> cloudstation -> program).
    broken = {**graph, "infra.program": graph["infra.program"] | {"infra.areas"},
              "infra.cloudstation": graph["infra.cloudstation"] | {"infra.program"}}
    assert _cycle(broken) is not None


def _entry_point() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(project["tool"]["setuptools"]["packages"]["find"]["include"]) >= {"infra", "components", "cloudstation_tools"}
    return project["project"]["scripts"]["cloudstation"]


def _run_entry_point(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    module, _, function = _entry_point().partition(":")
    code = (f"import sys; sys.argv[0] = 'cloudstation'; from {module} import {function} as main; "
            f"sys.exit(main({args!r}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # as `pip install -e .` puts the checkout on the path
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _subcommands(help_text: str) -> list[str]:
    return re.search(r"\{([\w,-]+)\}", help_text)[1].split(",")


def test_the_cloudstation_command_is_python_m_infra():
    from cloudstation_tools import cli

    module, _, function = _entry_point().partition(":")
    assert (module, function) == ("cloudstation_tools.cli", "main")
    infra_main = (ROOT / "infra" / "__main__.py").read_text()
    assert "from cloudstation_tools.cli import main" in infra_main  # the same function behind both
    python_m = subprocess.run([sys.executable, "-m", "infra", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    installed = _run_entry_point(["--help"], ROOT)
    assert python_m.returncode == installed.returncode == 0, (python_m.stderr, installed.stderr)
    assert installed.stdout.startswith("usage: cloudstation ")
    expected = sorted(cli.parser()._subparsers._group_actions[0].choices)
    assert sorted(_subcommands(python_m.stdout)) == sorted(_subcommands(installed.stdout)) == expected
    for command in ("render", "promote", "rollback", "preflight", "pin-images", "try-promotion"):
        assert command in expected


def test_every_environment_variable_the_tools_read_is_in_the_help():
    from cloudstation_tools import cli

    # The CLI's libraries, with the registry client it shares with the build provider (components/).
    libraries = [p for p in sorted((ROOT / "cloudstation_tools").glob("*.py")) if p.name != "cli.py"]
    source = "\n".join(p.read_text() for p in libraries + [ROOT / "components" / "registry_api.py"])
    read = set(re.findall(r"[\"'](CLOUDSTATION_[A-Z_]+|PULUMI_[A-Z_]+|KUBECONFIG|AWS_[A-Z_]+|DOCKER_[A-Z_]+|REQUESTS_CA_BUNDLE)[\"']", source))
    assert {"PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE",
            "CLOUDSTATION_REGISTRY_PASSWORD", "DOCKER_HOST"} <= read
    parser = cli.parser()
    helps = {name: sub.format_help() for name, sub in parser._subparsers._group_actions[0].choices.items()}
    everything = "\n".join(helps.values())
    assert not sorted(v for v in read if v not in everything)
    for name, text in helps.items():  # the backend and passphrase apply to every command
        for variable in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE_FILE"):
            assert variable in text, (name, variable)
    assert "KUBECONFIG" in helps["preflight"] and "CLOUDSTATION_REGISTRY_USERNAME" in helps["promote"]


def test_the_command_finds_the_repository_from_a_subdirectory(tmp_path):
    from cloudstation_tools import cli

    subdirectory = ROOT / "entities"
    assert cli.find_root(subdirectory) == ROOT
    assert cli.find_root(ROOT / "docs") == ROOT
    # From entities/: the reference is found at the root's docs/, and is current.
    result = _run_entry_point(["config-reference", "--check"], subdirectory)
    assert result.returncode == 0, result.stdout + result.stderr
    # A repository elsewhere (a user's copy) is found from inside it, not this checkout.
    (tmp_path / "infra").mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: cloudstation\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert cli.find_root(tmp_path / "a" / "b") == tmp_path
