"""`coldsnap capture` and `coldsnap restore`: from the user's own launch command line or a capsule
name (with options for what a request file holds), or from a request file, the machine-readable
form (`coldsnap schema capture|restore`, docs/cli.md). The work is the Machine's."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click

from coldsnap.artifacts import Store
from coldsnap.backends.inet import PortInUse, check_port_free
from coldsnap.machine import (
    CaptureRequest,
    Machine,
    ModelRef,
    Request,
    RequestError,
    RestoreRequest,
    StepEvent,
    parse_request,
)

from . import _serving
from ._cmdline import notice, parse_launch
from ._errors import finish, reported, say

DEFAULT_STORE = Path("/var/lib/coldsnap/store")
_TAG = re.compile(r"[^A-Za-z0-9._-]+")


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def load(path: str) -> Request:
    """The request in the file at `path` (`-`: stdin), parsed strictly."""
    try:
        raw = click.get_text_stream("stdin").read() if path == "-" else Path(path).read_text()
        data = json.loads(raw)
    except ValueError as exc:
        raise RequestError([("$", f"{path} is not JSON: {exc}")]) from None
    except OSError as exc:
        raise RequestError([("$", f"cannot read {path}: {exc.strerror}")]) from None
    return parse_request(data)


def request_json(request: Request) -> str:
    return json.dumps(attrs.asdict(request), indent=2)


def print_event(event: StepEvent) -> None:
    if event.phase in ("done", "skipped", "failed", "compensated", "compensation_failed"):
        detail = f"  ({event.detail})" if event.detail else ""
        click.echo(
            f"  {event.spec:<13} {event.step:<20} {event.phase:<20} {event.seconds:7.3f} s{detail}"
        )


def _workdir(given: Path | None, store: Path, operation: str, name: str) -> str:
    """The workdir the user gave, or a fresh one beside the store, under STORE/../ops."""
    if given:
        return str(given.expanduser().absolute())
    ops = store.parent / "ops"
    ops.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return str(ops / f"{operation}-{name}-{stamp}-{uuid.uuid4().hex[:6]}")


def _tag_of(text: str) -> str:
    return _TAG.sub("-", text).strip("-._")[:128] or "capsule"


def _given(ctx: click.Context, *names: str) -> list[str]:
    """The options among `names` the user set on the command line."""
    source = click.core.ParameterSource.COMMANDLINE
    return [f"--{n.replace('_', '-')}" for n in names if ctx.get_parameter_source(n) == source]


# -- capture ------------------------------------------------------------------------------------

_CAPTURE_HELP = """Capture an SGLang server, started from your own launch command line.

\b
  coldsnap capture --name tiny --store /var/lib/coldsnap/store -- \\
      python -m sglang.launch_server --model-path /models/tiny --port 30000
  coldsnap capture REQUEST_FILE          # the machine-readable form (JSON)

After `--`, `python -m sglang.launch_server ...` or `sglang serve ...` as you run it: the model
comes from --model-path, the tensor-parallel size from --tp-size, and every other flag goes to
the engine as written. coldsnap owns only where the engine listens: it drops --host and --port
(the capture serves on 127.0.0.1 at a port it picks; restore with --port to serve on yours) and
says so on stderr. Flags it cannot honour (--api-key, --config, --dp-size 2, ...) are refused,
named. --print-request prints the request file the command line makes and exits; its format is
`coldsnap schema capture` (docs/cli.md has examples).
"""

_CAPTURE_OPTIONS = ("name", "driver", "provider", "store", "workdir", "model_id", "revision",
                    "keep_source")  # fmt: skip


@click.command(help=_CAPTURE_HELP, context_settings={"allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--name", help="Publish the capsule under this tag [default: the model's name].")
@click.option("--driver", default="n610", show_default=True, help="n610 or n580.")
@click.option("--provider", default="native", show_default=True, help="native or recovery.")
@click.option(
    "--store", type=click.Path(path_type=Path), default=DEFAULT_STORE, show_default=True,
    help="The capsule store (created if missing).",
)  # fmt: skip
@click.option(
    "--workdir", type=click.Path(path_type=Path),
    help="This operation's directory [default: STORE/../ops/capture-NAME-TIME].",
)  # fmt: skip
@click.option("--model-id", help="The model's id [default: the model directory's name].")
@click.option(
    "--revision", help="The revision the capsule binds [default: 'local' for a directory]."
)
@click.option("--keep-source", is_flag=True, help="Leave the captured server running.")
@click.option("--print-request", is_flag=True, help="Print the request JSON and exit.")
@click.pass_context
def capture(ctx: click.Context, args: tuple[str, ...], print_request: bool, **options: Any) -> None:
    with reported(_debug):
        if len(args) == 1:
            if given := _given(ctx, *_CAPTURE_OPTIONS):
                raise click.UsageError(
                    f"{', '.join(given)}: a request file says this itself; these options go "
                    "with a launch command line (after --)"
                )
            request = load(args[0])
        else:
            request = _capture_request(args, **options)
        if print_request:
            click.echo(request_json(request))
            return
        if not isinstance(request, CaptureRequest):
            raise RequestError([("kind", "`coldsnap capture` takes a capture request")])
        receipt = Machine.for_request(request, subscribers=[print_event]).capture(request)
    if receipt.ok:
        say(
            f"captured {request.name or receipt.facts.get('capsule_digest')}; serve it with: "
            f"coldsnap restore {request.name or receipt.facts.get('capsule_digest')} "
            f"--store {request.store} [--port PORT]"
        )
    finish(receipt)


def _capture_request(
    args: tuple[str, ...],
    *,
    name: str | None,
    driver: str,
    provider: str,
    store: Path,
    workdir: Path | None,
    model_id: str | None,
    revision: str | None,
    keep_source: bool,
) -> CaptureRequest:
    line = parse_launch(args)
    say(notice(line))
    local = Path(line.model_path).expanduser()
    if local.is_dir():
        model = ModelRef(
            id=model_id or local.resolve().name,
            revision=revision or "local",
            path=str(local.resolve()),
        )
    else:  # a Hugging Face id, found in the local cache (never downloaded)
        if not revision:
            raise RequestError(
                [
                    (
                        "--revision",
                        f"{line.model_path!r} is no local directory: as a Hugging "
                        "Face id it needs --revision",
                    )
                ]
            )
        model = ModelRef(id=model_id or line.model_path, revision=revision)
    store = store.expanduser().absolute()
    tag = name or _tag_of(Path(model.id).name)
    return CaptureRequest(
        driver=driver,
        provider=provider,
        model=model,
        workdir=_workdir(workdir, store, "capture", tag),
        store=str(store),
        name=tag,
        engine_args=line.engine_args,
        tp=line.tp,
        keep_source=keep_source,
    )


# -- restore ------------------------------------------------------------------------------------

_RESTORE_HELP = """Restore a capsule and leave it serving; print its URL and PID.

\b
  coldsnap restore tiny --store /var/lib/coldsnap/store --port 30000
  coldsnap restore REQUEST_FILE          # the machine-readable form (JSON)

NAME is a capsule's tag or sha256: digest. Driver, provider, engine and engine flags default
to the capsule's own; anything after `--` replaces the engine flags. With --port the restored
server serves on 127.0.0.1:PORT (n610 moves the image's listening socket there before the
restore; n580 builds the engine on it), else on its capture port; a port in use is refused
first. The served engine is recorded under --serve-as (default: NAME) for `coldsnap status` and
`coldsnap stop`. The request file's format is `coldsnap schema restore`.
"""

_RESTORE_OPTIONS = ("store", "workdir", "driver", "provider", "model_path", "serve_as")


@click.command(help=_RESTORE_HELP)
@click.argument("target", metavar="NAME|REQUEST_FILE")
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--store", type=click.Path(path_type=Path), default=DEFAULT_STORE, show_default=True,
    help="The capsule store.",
)  # fmt: skip
@click.option("--port", type=click.IntRange(1, 65535), help="Serve on 127.0.0.1:PORT.")
@click.option(
    "--workdir", type=click.Path(path_type=Path),
    help="This operation's directory [default: STORE/../ops/restore-NAME-TIME].",
)  # fmt: skip
@click.option("--driver", help="[default: the capsule's]")
@click.option("--provider", help="[default: the capsule's]")
@click.option(
    "--model-path", type=click.Path(path_type=Path),
    help="The checkpoint (needed by provider recovery and driver n580).",
)  # fmt: skip
@click.option("--serve-as", help="Name the served engine for status/stop [default: NAME].")
@click.option("--print-request", is_flag=True, help="Print the request JSON and exit.")
@click.option("--json", "as_json", is_flag=True, help="No step lines: one JSON object only.")
@click.pass_context
def restore(
    ctx: click.Context,
    target: str,
    engine_args: tuple[str, ...],
    port: int | None,
    print_request: bool,
    as_json: bool,
    serve_as: str | None,
    **options: Any,
) -> None:
    with reported(_debug):
        if _is_file(target):
            if given := _given(ctx, *_RESTORE_OPTIONS[:-1]) or (["--"] if engine_args else []):
                raise click.UsageError(
                    f"{', '.join(given)}: a request file says this itself (only --port, "
                    "--serve-as and --json go with one)"
                )
            request = load(target)
            if not isinstance(request, RestoreRequest):
                raise RequestError([("kind", "`coldsnap restore` takes a restore request")])
            if port is not None:
                request = attrs.evolve(request, port=port)
        else:
            request = _restore_request(target, engine_args, port=port, **options)
        if print_request:
            click.echo(request_json(request))
            return
        name = serve_as or (request.artifact if not request.artifact.startswith("sha256:")
                            else request.artifact.removeprefix("sha256:")[:12])  # fmt: skip
        _check_free(name, request.port)
        subscribers: list[Callable[[StepEvent], None]] = [] if as_json else [print_event]
        receipt = Machine.for_request(request, subscribers=subscribers).restore(request)
    facts = receipt.facts
    extra: dict[str, Any] = {}
    if receipt.ok:
        extra = {
            "name": name,
            "url": facts.get("engine_url"),
            "pid": facts.get("engine_pid"),
            "capsule_digest": facts.get("capsule_digest"),
            "timings": {k: round(v, 3) for k, v in receipt.timings().items()},
        }
        serving = _serving.Serving(
            name=name,
            workdir=str(Path(request.workdir).resolve()),
            artifact=request.artifact,
            capsule_digest=extra["capsule_digest"],
            url=extra["url"],
            pid=extra["pid"],
            started=time.time(),
        )
        with reported(_debug):
            _serving.record(serving)
        if not as_json:
            click.echo(
                f"serving {name} at {extra['url']} (pid {extra['pid']}); stop it with: "
                f"coldsnap stop {name}"
            )
    finish(receipt, extra)


def _is_file(target: str) -> bool:
    """A request file: `-`, a file that exists, or a name a tag cannot have (a path, *.json)."""
    return target == "-" or Path(target).is_file() or "/" in target or target.endswith(".json")


def _check_free(name: str, port: int | None) -> None:
    """Refuses, before anything starts, a name that already serves or a port in use."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", name):
        raise RequestError([("--serve-as", f"{name!r} is not a name (letters, digits, . _ -)")])
    for serving in _serving.records():
        if serving.name == name and _serving.state(Path(serving.workdir))["running"]:
            raise RequestError(
                [
                    (
                        "--serve-as",
                        f"{name!r} already serves at {serving.url} (pid "
                        f"{serving.pid}): stop it, or pick another --serve-as",
                    )
                ]
            )
    if port is not None:
        try:
            check_port_free("127.0.0.1", port)
        except PortInUse as exc:
            raise RequestError([("port", str(exc))]) from None


def _restore_request(
    target: str,
    engine_args: tuple[str, ...],
    *,
    port: int | None,
    store: Path,
    workdir: Path | None,
    driver: str | None,
    provider: str | None,
    model_path: Path | None,
) -> RestoreRequest:
    from coldsnap.capsules import RECORD_NAME, CaptureRecord

    from ._store_cmds import capture_record

    store = store.expanduser().absolute()
    if not store.is_dir():
        raise RequestError([("--store", f"{store} is not a directory")])
    record: CaptureRecord | None = capture_record(Store(store), target)
    if record is None:
        raise RequestError([("NAME", f"capsule {target} has no {RECORD_NAME}: use a request file")])
    driver, provider = driver or record.driver, provider or record.provider
    model = None
    if model_path is not None:
        model = ModelRef(
            id=record.model_id, revision=record.revision, path=str(model_path.resolve())
        )
    elif provider == "recovery" or driver == "n580":
        model = ModelRef(id=record.model_id, revision=record.revision)  # from the HF cache
    tag = _tag_of(target.removeprefix("sha256:")[:12] if target.startswith("sha256:") else target)
    return RestoreRequest(
        driver=driver,
        provider=provider,
        artifact=target,
        workdir=_workdir(workdir, store, "restore", tag),
        store=str(store),
        model=model,
        engine=record.engine,
        engine_args=engine_args or record.engine_args,  # the capture's, which admit compares
        port=port,
    )


__all__ = ["DEFAULT_STORE", "capture", "load", "print_event", "request_json", "restore"]
