"""Command line: `cloudstation <command>` (pip install -e .), or `python -m infra <command>`.

    check [--stack STACK]             every problem of the stack files, with file, line and fix (run it first)
    diff --stack STACK [--against R] what `pulumi up` would create, update, replace, delete, and why
    render --stack STACK --out DIR    write what STACK would deploy (no CLI, cluster or Docker)
    port-forwards --stack STACK       the port-forwards `pulumi up` of STACK needs (scripts/up.sh)
    preflight --stack STACK           check tools, cluster and Docker before deploying (scripts/up.sh)
    promote --from test --to prod     copy test's deployed digest-pinned images into Pulumi.prod.yaml
    rollback --stack prod [--to ID]   undo the latest promotion, or every one after ID (docs/promotion.md)
    try-promotion                     promote and roll back locally: throwaway registry, synthetic images
    config-reference [--check]        write docs/config-reference.md from the config models
    pin-images [--image NAME]         record the digest each pinned image tag resolves to (skopeo)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infra.config import ConfigError
from components.limits import DEFAULT_DEADLINE_SECONDS


def _render(args: argparse.Namespace) -> int:
    import gc

    # One batch, then the process exits: the cyclic collector would only rescan a heap that lives
    # to the end (infra/program.py main; bench/render_cost.py measures it).
    gc.disable()
    from cloudstation_tools import render

    stack_file = None
    if args.promoted_from and _never_promoted(args.stack):
        # A stack before its first promotion (prod) refuses to render; show it as `promote
        # --from <source>` would write it, from the source stack's own offline render. Once
        # promoted, the stack file renders as it is.
        import tempfile

        from cloudstation_tools import promote

        images = render.render(args.promoted_from).outputs[promote.IMAGES_OUTPUT]
        text = promote.first_promotion_text(render.ROOT, images, args.promoted_from, args.stack)
        with tempfile.TemporaryDirectory() as directory:
            (Path(directory) / f"Pulumi.{args.stack}.yaml").write_text(text, encoding="utf-8")
            stack_file = render.StackFile.read(args.stack, Path(directory))
    rendered = render.render(args.stack, stack_file=stack_file)
    render.write(rendered, Path(args.out))
    print(
        f"rendered stack {args.stack}: {len(rendered.registrations)} resources, "
        f"{rendered.object_count()} Kubernetes objects -> {args.out}"
    )
    return 0


def _never_promoted(stack: str) -> bool:
    """No entity of Pulumi.<stack>.yaml has an image yet."""
    from cloudstation_tools import promote, render, stack_file

    name = f"Pulumi.{stack}.yaml"
    parsed = stack_file.parse(stack_file.read_text(promote.stack_path(render.ROOT, stack)), name)
    return all(slot.value is None for slot in parsed.slots.values())


def port_forwards(config) -> list[str]:
    """`namespace service local:remote` for each in-cluster service that `pulumi up` itself talks
    to through a port-forward: the managed registry it pushes to (docs/registry.md) and the Armada
    REST API it manages queues through (docs/armada-queues.md), when configured at localhost.
    Not the registry when the builds reach it through their own tunnel (armada builds without a
    pushHost: infra/builds.py `tunnels_to_registry`, docs/builds.md)."""
    from urllib.parse import urlsplit

    from components.armada.config import SERVER, SERVER_PORTS
    from components.registry import PORT as REGISTRY_PORT
    from infra.builds import tunnels_to_registry
    from infra.delivery import REGISTRY_NAME

    forwards = []
    registry = config.platform.registry
    push_host, _, push_port = registry.effective_push_host.partition(":")
    if registry.mode == "managed" and push_host in ("localhost", "127.0.0.1") and not tunnels_to_registry(config):
        forwards.append(f"{config.platform.namespace} {REGISTRY_NAME} {push_port or 80}:{REGISTRY_PORT}")
    armada = config.platform.armada
    queue_api = urlsplit(armada.queue_api.url)
    if armada.enabled and armada.queue_api.enabled and queue_api.hostname in ("localhost", "127.0.0.1"):
        forwards.append(f"{armada.namespace} {SERVER} {queue_api.port or 80}:{SERVER_PORTS['http']}")
    return forwards


def _port_forwards(args: argparse.Namespace) -> int:
    from cloudstation_tools.render import validate_config

    # Images do not matter here: a prod stack before its promotion needs (and has) no port-forward either.
    for line in port_forwards(validate_config(args.stack, require_images=False)):
        print(line)
    return 0


def _check(args: argparse.Namespace) -> int:
    import time

    from cloudstation_tools import check

    started = time.perf_counter()
    report = check.run(Path(args.root), args.stack, args.against)
    if report.could_not_run and args.format == "text":
        print(f"error: {report.could_not_run}", file=sys.stderr)
    else:
        print(check.FORMATS[args.format](report, time.perf_counter() - started), end="")
    return report.exit_code


def _diff(args: argparse.Namespace) -> int:
    from cloudstation_tools import baseline, diff, engine
    from cloudstation_tools.check.stacks import reviewed

    root = Path(args.root)
    try:
        base = baseline.resolve(root, args.stack, args.against)
    except baseline.BaselineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if base is None:
        print(f"error: nothing to compare with: no {baseline.DEPLOYED / args.stack} (scripts/up.sh writes it after a "
              f"deployment) and {root} is not a git work tree; pass --against with a git ref or a render directory",
              file=sys.stderr)
        return 2
    stack = reviewed(root, args.stack)
    found = diff.steps(engine.Graph(base.resources), engine.Graph(stack.rendered.resources()))
    print((diff.as_json if args.format == "json" else diff.as_text)(args.stack, base.described, found), end="")
    return 1 if any(step.problems for step in found) else 0


def _preflight(args: argparse.Namespace) -> int:
    from cloudstation_tools import preflight

    if args.context_only:
        context, why = preflight.context_only(args.stack, Path(args.root))
        if context is None:
            print(f"error: no kube context: set cloudstation:kubernetes.context or a current context ({why})",
                  file=sys.stderr)
            return 1
        print(context)
        return 0
    report = preflight.check(args.stack, Path(args.root))
    if report.notes or report.problems:
        print(report.text(), file=sys.stderr)
    if report.problems:
        return 1
    print(report.context or "")
    return 0


def _report(result, verb: str, done: str) -> None:
    for note in result.notes:
        print(f"note: {note}")
    undoes = f" (undoes promotion {', '.join(map(str, result.undoes))})" if result.undoes else ""
    if not result.changes:
        if result.record is not None:
            print(f"{result.stack_file.name} unchanged; recorded as #{result.record['id']}{undoes}")
        elif result.dry_run and result.undoes:
            print(f"dry run: {result.stack_file.name} would stay unchanged{undoes}")
        else:
            print(f"{result.stack_file.name} already has these references; nothing to {verb}")
        return
    print(result.diff, end="")
    stats = result.stats
    cost = f"{stats.requests} registry requests, {stats.bytes_sent + stats.bytes_received} bytes"
    if result.dry_run:
        print(f"dry run: would {verb} {len(result.changes)} image(s) and tag them {', '.join(result.tags)}{undoes} "
              f"({cost})")
    else:
        print(
            f"{done} {len(result.changes)} image(s) in {result.stack_file.name}, tagged {', '.join(result.tags)}, "
            f"recorded as #{result.record['id']}{undoes} ({cost})"
        )


def _promote(args: argparse.Namespace) -> int:
    from cloudstation_tools import promote

    result = promote.promote(
        args.source, args.target, root=Path(args.root), projects=args.project, entities=args.entity,
        dry_run=args.dry_run, backend=args.backend, timeout=args.timeout, moving_tag=args.moving_tag,
    )
    _report(result, "promote", "promoted")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from cloudstation_tools import promote

    result = promote.rollback(
        args.stack, root=Path(args.root), dry_run=args.dry_run, to=args.to, force=args.force, timeout=args.timeout,
        moving_tag=args.moving_tag,
    )
    _report(result, "roll back", "rolled back")
    return 0


def _try_promotion(args: argparse.Namespace) -> int:
    from cloudstation_tools import try_promotion

    try:
        return try_promotion.main(keep=args.keep)
    except try_promotion.TryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _config_reference(args: argparse.Namespace) -> int:
    from cloudstation_tools import config_reference

    path = Path(args.out)
    if args.check:
        if path.is_file() and path.read_text(encoding="utf-8") == config_reference.render():
            return 0
        print(f"error: {path} is stale: run `python -m infra config-reference`", file=sys.stderr)
        return 1
    print(f"{path}: {'written' if config_reference.write(path) else 'up to date'}")
    return 0


def _pin_images(args: argparse.Namespace) -> int:
    from cloudstation_tools import pin_images

    changes, dropped = pin_images.pin(
        args.image, missing_only=args.missing, path=Path(args.digests), authfile=args.authfile,
        insecure_hosts=args.insecure_registry, dry_run=args.dry_run,
    )
    for change in changes:
        print(f"{change.name}: {change.ref} {change.old or '(no digest)'} -> {change.new}")
    for name in dropped:
        print(f"{name}: dropped its record (no longer the pinned tag)")
    verb = "would update" if args.dry_run else "updated"
    print(f"{Path(args.digests).name}: {verb} {len(changes)} digest(s)" if changes or dropped else
          f"{Path(args.digests).name}: every resolved digest is already recorded")
    # A stack file's named opt-out of a pin that has a digest now is refused by its config check.
    for stack_file, names in pin_images.opt_outs_to_remove(Path(args.root), [c.name for c in changes if c.old is None]):
        print(f"{stack_file}: remove {', '.join(names)} from cloudstation:platform.images.allowUnpinned "
              f"({'it runs' if len(names) == 1 else 'they run'} by digest now; the stack refuses the entry until it goes)")
    return 0


MOVING_TAG_HELP = (
    "also move this tag (e.g. prod) to each image; off by default: prod deploys by digest, and ECR repositories "
    "with immutable tags refuse a moving tag (docs/promotion.md)"
)


def find_root(start: Path | None = None) -> Path:
    """The repository: the nearest directory holding Pulumi.yaml, walking up from `start` (the
    working directory), so the command runs from any directory inside it; outside one, the
    repository this package was loaded from."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / "Pulumi.yaml").is_file() and (directory / "infra").is_dir():
            return directory
    return Path(__file__).resolve().parent.parent


ENV_COMMON = (
    "environment (every command):\n"
    "  PULUMI_BACKEND_URL           state backend; unset: Pulumi.yaml backend.url, else .pulumi-state/ if\n"
    "                               scripts/up.sh created it (file://ROOT/.pulumi-state)\n"
    "  PULUMI_CONFIG_PASSPHRASE     passphrase of the stack secrets (counts when set, even empty);\n"
    "  PULUMI_CONFIG_PASSPHRASE_FILE  else this file; unset both with the local backend:\n"
    "                               .pulumi-state/passphrase\n"
    "  The repository is the nearest directory with Pulumi.yaml above the working directory."
)
ENV_REGISTRY = (
    "\n\nregistry access:\n"
    "  CLOUDSTATION_REGISTRY_USERNAME, CLOUDSTATION_REGISTRY_PASSWORD  registry credentials; unset:\n"
    "                               $DOCKER_CONFIG/config.json, else ~/.docker/config.json\n"
    "  CLOUDSTATION_REGISTRY_HOST   the only host those credentials are sent to (unset: any)\n"
    "  CLOUDSTATION_INSECURE_REGISTRIES  comma-separated hosts reached over plain HTTP\n"
    "  CLOUDSTATION_REGISTRY_ADDRESSES   HOST=ADDRESS,... where to reach a registry host\n"
    "  DOCKER_CONFIG                directory of the docker config.json (default ~/.docker)\n"
    "  REQUESTS_CA_BUNDLE           CA file for registry TLS (default: system CAs)\n"
    "  HTTPS_PROXY, HTTP_PROXY, NO_PROXY  proxies, as urllib reads them"
)
ENV_STATE = (
    "\n\nstack state:\n"
    "  --backend, else PULUMI_BACKEND_URL, else Pulumi.yaml backend.url; other than file:// backends\n"
    "  are read with boto3 (s3://) or the pulumi CLI, which take cloud credentials from the environment\n"
    "  (AWS_PROFILE, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN...)"
)
ENV_PREFLIGHT = (
    "\n\ncluster and tools:\n"
    "  KUBECONFIG                   kubeconfig files (default ~/.kube/config)\n"
    "  DOCKER_HOST                  Docker engine (default the local socket)\n"
    "  PATH                         where pulumi, kubectl and docker are looked up"
)
ENV_PIN = (
    "\n\nimage pins:\n"
    "  PATH                         where skopeo is looked up; --authfile, else skopeo's defaults\n"
    "                               (REGISTRY_AUTH_FILE, ${XDG_RUNTIME_DIR}/containers/auth.json)"
)
ENV_CHECK = (
    "\n\nbaseline (data left behind, diff):\n"
    "  git                          on PATH, to render a git ref (--against REF, or HEAD by default)\n"
    "policy pack (check):\n"
    "  PULUMI_CONFIG, PULUMI_STACK  set while the pack's rules run, as the engine sets them, then restored"
)
ENV_TRIAL = (
    "\n\ntry-promotion sets its own PULUMI_BACKEND_URL, DOCKER_CONFIG and CLOUDSTATION_REGISTRY_* for\n"
    "the commands it runs, and finds registry (docker-registry) and skopeo on PATH."
)


def _epilog(*parts: str) -> dict:
    return {"epilog": ENV_COMMON + "".join(parts), "formatter_class": argparse.RawDescriptionHelpFormatter}


def parser(prog: str = "python -m infra") -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], **_epilog())
    commands = root.add_subparsers(dest="command", required=True)

    project_dir = str(find_root())
    check = commands.add_parser(
        "check", help="check every stack file of the project (or one): config, stacks sharing a cluster, budget, "
        "schemas, policy pack, data left behind; exit 0 clean, 1 problems, 2 could not run", **_epilog(ENV_CHECK))
    check.add_argument("--stack", help="report only what concerns Pulumi.<stack>.yaml (the others are still read)")
    check.add_argument("--format", choices=("text", "json", "github"), default="text",
                       help="text (default), json (for tools), github (workflow annotations on the files)")
    check.add_argument("--against", metavar="REF",
                       help="what claims left behind are judged against: a git ref or a render directory (default: "
                            "the last deployment from this checkout, .cloudstation/deployed/<stack>, else HEAD)")
    check.add_argument("--root", default=project_dir, help=argparse.SUPPRESS)
    check.set_defaults(run=_check)

    difference = commands.add_parser(
        "diff", help="what `pulumi up` of the working tree would create, update, replace or delete, and why (offline)",
        **_epilog(ENV_CHECK))
    difference.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    difference.add_argument("--against", metavar="REF",
                            help="a git ref (HEAD, origin/main, ORIG_HEAD after a pull) or a render directory "
                                 "(python -m infra render --out DIR); default: the last deployment from this checkout "
                                 "(.cloudstation/deployed/<stack>), else HEAD")
    difference.add_argument("--format", choices=("text", "json"), default="text")
    difference.add_argument("--root", default=project_dir, help=argparse.SUPPRESS)
    difference.set_defaults(run=_diff)

    render = commands.add_parser("render", help="render a stack's Kubernetes objects and resources offline", **_epilog())
    render.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    render.add_argument("--out", required=True, help="output directory")
    render.add_argument(
        "--promoted-from", metavar="SOURCE",
        help="if the stack was never promoted, render it as `promote --from SOURCE` would first write it, with "
        "SOURCE's offline-rendered images (the digests are the mocks'); a promoted stack renders as it is",
    )
    render.set_defaults(run=_render)

    forwards = commands.add_parser(
        "port-forwards", help="print `namespace service local:remote` for each port-forward `pulumi up` needs", **_epilog())
    forwards.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    forwards.set_defaults(run=_port_forwards)

    checks = commands.add_parser(
        "preflight", help="check the tools, cluster and Docker engine STACK's deployment needs; print its kube context", **_epilog(ENV_PREFLIGHT))
    checks.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    checks.add_argument("--context-only", action="store_true", help="only print the stack's kube context")
    checks.add_argument("--root", default=project_dir, help=argparse.SUPPRESS)
    checks.set_defaults(run=_preflight)

    promote = commands.add_parser("promote", help="copy a stack's deployed image references into another stack file", **_epilog(ENV_STATE, ENV_REGISTRY))
    promote.add_argument("--from", dest="source", required=True, help="stack whose deployed `images` output is read")
    promote.add_argument("--to", dest="target", required=True, help="stack whose Pulumi.<stack>.yaml is edited")
    promote.add_argument("--project", action="append", default=[], help="promote only this project (repeatable)")
    promote.add_argument("--entity", action="append", default=[], help="promote only PROJECT/ENTITY (repeatable)")
    promote.add_argument("--dry-run", action="store_true", help="print the exact change; write and tag nothing")
    promote.add_argument(
        "--backend", help="state backend URL (file://DIR or s3://BUCKET?...); default PULUMI_BACKEND_URL"
    )
    promote.add_argument("--timeout", type=float, default=DEFAULT_DEADLINE_SECONDS,
                         help="give up after this many seconds of state, registry and API waits (default %(default)g)")
    promote.add_argument("--moving-tag", metavar="TAG", help=MOVING_TAG_HELP)
    promote.add_argument("--root", default=project_dir, help=argparse.SUPPRESS)
    promote.set_defaults(run=_promote)

    rollback = commands.add_parser("rollback", help="restore the references the latest promotion replaced", **_epilog(ENV_REGISTRY))
    rollback.add_argument("--stack", required=True, help="stack whose latest promotion is undone")
    rollback.add_argument(
        "--to", metavar="PROMOTION",
        help="undo every promotion after this one: its id, its time (2026-03-04T05:06:07Z) or its tag (prod-20260304T050607Z)",
    )
    rollback.add_argument("--force", action="store_true",
                          help="also replace image references edited by hand since (the record keeps them)")
    rollback.add_argument("--moving-tag", metavar="TAG", help=MOVING_TAG_HELP)
    rollback.add_argument("--dry-run", action="store_true", help="print the exact change; write and tag nothing")
    rollback.add_argument("--timeout", type=float, default=DEFAULT_DEADLINE_SECONDS,
                          help="give up after this many seconds of registry waits (default %(default)g)")
    rollback.add_argument("--root", default=project_dir, help=argparse.SUPPRESS)
    rollback.set_defaults(run=_rollback)

    trial = commands.add_parser(
        "try-promotion",
        help="promote and roll back on this machine: a throwaway local registry, synthetic images, a copy of "
             "Pulumi.prod.yaml (docs/promotion.md)", **_epilog(ENV_TRIAL))
    trial.add_argument("--keep", action="store_true", help="keep the temporary directory afterwards")
    trial.set_defaults(run=_try_promotion)

    reference = commands.add_parser(
        "config-reference", help="write the stack config reference (docs/config-reference.md) from the models", **_epilog())
    reference.add_argument(
        "--out", default=str(Path(project_dir) / "docs" / "config-reference.md"), help="file to write"
    )
    reference.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    reference.set_defaults(run=_config_reference)

    from infra.versions import DIGESTS_FILE

    pins = commands.add_parser(
        "pin-images", help="resolve each pinned image tag of infra/versions.py to its digest (needs skopeo and the registries)", **_epilog(ENV_PIN))
    pins.add_argument("--image", action="append", default=[], help="only this pin (repeatable); default: every pin")
    pins.add_argument("--missing", action="store_true", help="only pins without a digest for their tag")
    pins.add_argument("--dry-run", action="store_true", help="print the digests; write nothing")
    pins.add_argument("--authfile", help="registry credentials (containers-auth.json, as `skopeo login` writes)")
    pins.add_argument(
        "--insecure-registry", action="append", default=[], metavar="HOST",
        help="skip TLS verification for this registry host only (a local test registry; repeatable)",
    )
    pins.add_argument("--digests", default=str(DIGESTS_FILE), help=argparse.SUPPRESS)
    pins.add_argument("--root", default=project_dir, help=argparse.SUPPRESS)
    pins.set_defaults(run=_pin_images)
    return root


def main(argv: list[str] | None = None) -> int:
    prog = "cloudstation" if Path(sys.argv[0]).name == "cloudstation" else "python -m infra"
    args = parser(prog).parse_args(argv)
    from cloudstation_tools import local_backend

    try:
        # The backend and passphrase scripts/up.sh used, for every command (cloudstation_tools/local_backend.py).
        with local_backend.applied(Path(getattr(args, "root", None) or local_backend.ROOT)):
            return args.run(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        from cloudstation_tools import pin_images, promote, stack_file, state_backend
        from components import registry_api

        known = (
            promote.PromotionRefused, registry_api.RegistryError, stack_file.StackFileError, state_backend.StateError,
            pin_images.PinError,
        )
        if not isinstance(error, known):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
