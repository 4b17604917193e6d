"""`coldsnap capture` and `coldsnap restore`: from the user's own launch command line or a capsule
name (with options for what a request file holds), or from a request file, the machine-readable
form (`coldsnap schema capture|restore`, docs/cli.md). The work is the Machine's."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import click

from coldsnap._errors import ColdsnapError, EnvironmentMissing, RefusedError
from coldsnap._paths import DEFAULT_STORE
from coldsnap.artifacts import Store
from coldsnap.backends.inet import PortInUse, check_port_free
from coldsnap.machine import (
    REGISTRY,
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
from ._cmdline import engine_adapter, notice, parse_launch
from ._errors import finish, reported, say
from ._events import print_json_event
from ._progress import ENDED, LiveSteps, step_line
from ._quiet import libraries_to_log
from ._restore_flags import check_honoured, check_key, give_key, set_over, split_key
from ._signals import interrupts

_TAG = re.compile(r"[^A-Za-z0-9._-]+")


class NotRoot(RefusedError, EnvironmentMissing, PermissionError):
    """A capture or restore run without root: CRIU, which snapshots and restores the engine's
    processes, needs it."""


def _need_root(operation: str) -> None:
    """Refuses, before anything starts, a capture or restore this user cannot finish: without
    root the engine would start (a minute and more) and the snapshot then fail."""
    if (uid := os.geteuid()) != 0:
        raise NotRoot(
            f"{operation} needs root (running as uid {uid}): CRIU snapshots and restores the "
            "engine's processes; run it as root (`coldsnap doctor` checks this host)"
        )


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: JSON readers keep the last of a repeated
    key silently, so a reviewer of the file could read one value and coldsnap act on another."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RequestError([(key, "is given twice")])
        out[key] = value
    return out


def load(path: str) -> Request:
    """The request in the file at `path` (`-`: stdin), parsed strictly: JSON, or a YAML recipe
    when its name ends in .yaml or .yml."""
    if path.endswith((".yaml", ".yml")):
        from ._recipes import load_recipe  # imports yaml, which a JSON request never needs

        return load_recipe(Path(path), _recipe_defaults)
    try:
        raw = click.get_text_stream("stdin").read() if path == "-" else Path(path).read_text()
        data = json.loads(raw, object_pairs_hook=_once)
    except RequestError:
        raise
    except ValueError as exc:
        raise RequestError([("$", f"{path} is not JSON: {exc}")]) from None
    except RecursionError:  # the reader's own bound on nesting (a request nests three levels)
        raise RequestError([("$", f"{path} nests deeper than a JSON request can")]) from None
    except OSError as exc:
        raise RequestError([("$", f"cannot read {path}: {exc.strerror}")]) from None
    return parse_request(data)


def _recipe_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A recipe's request with the command line's defaults where it names none: the store, a
    fresh workdir under STORE/../ops for each run, and the driver and provider (a capture's
    option defaults; a restore's, the capsule's). Anything malformed is left for the request's
    own check to name."""
    out = dict(data)
    operation = {CaptureRequest.KIND: "capture", RestoreRequest.KIND: "restore"}.get(
        out.get("kind"))  # fmt: skip
    if operation is None:
        return out
    if not isinstance(out.setdefault("store", str(DEFAULT_STORE)), str):
        return out
    store = Path(out["store"]).expanduser().absolute()
    if operation == "capture":
        for name in ("driver", "provider"):
            out.setdefault(name, _option_default(capture, name))
        model = out.get("model")
        named = model.get("path") or model.get("id") if isinstance(model, dict) else None
        tag = out.get("name") or _tag_of(Path(str(named or "capsule")).name)
    else:
        artifact = str(out.get("artifact") or "capsule")
        tag = _tag_of(artifact.removeprefix("sha256:")[:12])
        if ("driver" not in out or "provider" not in out) and store.is_dir():
            from ._store_cmds import capture_record

            record = capture_record(Store.open(store), artifact)
            if record is not None:
                out.setdefault("driver", record.driver)
                out.setdefault("provider", record.provider)
                out.setdefault("engine", record.engine)
                out.setdefault("engine_args", list(record.engine_args))
    out.setdefault("workdir", _workdir(None, store, operation, str(tag)))
    return out


def _option_default(command: click.Command, name: str) -> Any:
    """The default of `command`'s option `name`: a recipe gets what the command line gets."""
    return next(p.default for p in command.params if p.name == name)


def request_json(request: Request) -> str:
    return json.dumps(attrs.asdict(request), indent=2)


def print_event(event: StepEvent) -> None:
    """One line per ended step (what `resume` prints; capture and restore show more, live)."""
    if event.phase in ENDED:
        click.echo(step_line(event))


@contextlib.contextmanager
def _watching(as_json: bool) -> Iterator[Callable[[StepEvent], None]]:
    """The subscriber a capture or restore runs with: JSON events, or the live display."""
    if as_json:
        yield print_json_event
        return
    with LiveSteps() as live:
        yield live


def _workdir(given: Path | None, store: Path, operation: str, name: str) -> str:
    """The workdir the user gave, or a fresh one beside the store, under STORE/../ops. Named
    only: the operation makes it with its parents (a printed request makes nothing)."""
    if given:
        return str(given.expanduser().absolute())
    ops = store.parent / "ops"
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
the engine as written. coldsnap owns only where the engine listens: it takes out --host and
--port (the capture serves on 127.0.0.1 at a port it picks) and keeps them in the capsule, where
a restore serves by default; it says so on stderr. --api-key KEY makes a keyed capsule: the
captured engine runs with a key of coldsnap's, and each restore is given the key it serves with
(restore NAME -- --api-key KEY). Flags it cannot honour (--admin-api-key, --config, --dp-size 2,
...) are refused, named. --print-request prints the request file the command line
makes and exits; its format is `coldsnap schema capture` (docs/cli.md has examples). --recipe
reads the request from YAML. With --json, one JSON event per line (docs/cli.md).
"""

_CAPTURE_OPTIONS = ("name", "driver", "provider", "store", "workdir", "model_id", "revision",
                    "keep_source")  # fmt: skip


@click.command(help=_CAPTURE_HELP, context_settings={"allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--recipe", type=click.Path(dir_okay=False, path_type=Path),
    help="A YAML recipe: the request file's content as YAML.",
)  # fmt: skip
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
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line (docs/cli.md).")
@click.pass_context
def capture(
    ctx: click.Context,
    args: tuple[str, ...],
    recipe: Path | None,
    print_request: bool,
    as_json: bool,
    **options: Any,
) -> None:
    with reported(_debug):
        args = _one_source(args, recipe, "a launch command line (after --) or REQUEST_FILE")
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
        _need_root("capture")
        with (
            libraries_to_log(request.workdir),
            _watching(as_json) as subscriber,
            interrupts(request.workdir, events=as_json) as cancel,
        ):
            machine = Machine.for_request(request, subscribers=[subscriber])
            receipt = machine.capture(request, cancel=cancel)
    if receipt.ok and not as_json:
        say(
            f"captured {request.name or receipt.facts.get('capsule_digest')}; serve it with: "
            f"coldsnap restore {request.name or receipt.facts.get('capsule_digest')} "
            f"--store {request.store} [--port PORT]"
        )
    finish(receipt, events=as_json)


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
    if not line.model_path:
        raise RequestError([("--model-path", "is empty: name the model's directory or hub id")])
    say(notice(line))
    model = _model_ref(line.model_path, model_id, revision, ("--model-path", "--revision"))
    draft = None
    if line.draft_path is not None:
        draft = _model_ref(line.draft_path, None, line.draft_revision,
                           ("--speculative-draft-model-path",
                            "--speculative-draft-model-revision"))  # fmt: skip
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
        serve_port=line.port,
        serve_host=line.host,
        draft=draft,
    )


LOCAL_REVISION = "local"
"""The revision a capsule of a model captured from a local directory binds (no hub id names
that directory: a restore that needs the checkpoint is given its path)."""


def _model_ref(
    path: str, model_id: str | None, revision: str | None, flags: tuple[str, str]
) -> ModelRef:
    """A local directory as it is; anything else is a Hugging Face id found in the local cache
    (never downloaded), which needs a revision (`flags`: where the path and the revision come
    from). A path that is no directory is named as the problem, not the revision."""
    path_flag, revision_flag = flags
    local = Path(path).expanduser()
    if local.is_dir():
        return ModelRef(id=model_id or local.resolve().name,
                        revision=revision or LOCAL_REVISION, path=str(local.resolve()))  # fmt: skip
    if path.startswith(("/", "~", "./", "../")):  # plainly a path: no hub id looks like one
        raise RequestError([(path_flag, f"{path!r} is no directory")])
    if not revision:
        raise RequestError(
            [(path_flag, f"{path!r} is no directory here; if it is a Hugging Face id (read "
              f"from the local cache, never downloaded), give its revision with {revision_flag}")]
        )  # fmt: skip
    return ModelRef(id=model_id or path, revision=revision)


# -- restore ------------------------------------------------------------------------------------

_RESTORE_HELP = """Restore a capsule and leave it serving; print its URL and PID.

\b
  coldsnap restore tiny --store /var/lib/coldsnap/store --port 30000
  coldsnap restore REQUEST_FILE          # the machine-readable form (JSON)

NAME is a capsule's tag, its sha256: digest or the short digest `coldsnap ls` prints (one
that begins several digests is refused, naming them); a REQUEST_FILE is spelled as a path (a
'/', a leading '.', a .json, .yaml or .yml ending; '-': stdin), whatever files exist. Driver,
provider, engine and engine flags default to the capsule's own; anything after `--` replaces
the engine flags.
A keyed capsule (captured with --api-key) is given the key it serves with after `--`: `--
--api-key KEY` (the key never joins the request; docs/cli.md, API keys).
The restored server serves on --host and --port, by default those of the captured launch command
line (else 127.0.0.1 and the port the capture served on); n610 moves the image's listening
socket there before the restore, n580 builds the engine on them. A port in use is refused first.
The served engine is recorded under --serve-as (default: the tag, else the digest's first 12
hex digits) for `coldsnap status` and `coldsnap stop`. A restore takes back the PIDs its image
had: to serve a capsule again beside a running restore of it, give --replica (PID and network
namespaces of its own, where the driver offers them; its port is served on the host through a
forwarder), its own --port and its own --serve-as. The request file's format is `coldsnap
schema restore`; --recipe reads it from YAML.
"""

_RESTORE_OPTIONS = ("store", "workdir", "driver", "provider", "model_path", "serve_as")


@click.command(help=_RESTORE_HELP)
@click.argument("target", metavar="NAME|REQUEST_FILE", required=False)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--store", type=click.Path(path_type=Path), default=DEFAULT_STORE, show_default=True,
    help="The capsule store.",
)  # fmt: skip
@click.option(
    "--port", type=click.IntRange(1, 65535),
    help="Serve on PORT [default: the captured command line's --port].",
)  # fmt: skip
@click.option(
    "--host", help="Listen on this IPv4 address [default: the captured command line's --host, "
    "else 127.0.0.1].",
)  # fmt: skip
@click.option(
    "--workdir", type=click.Path(path_type=Path),
    help="This operation's directory [default: STORE/../ops/restore-NAME-TIME].",
)  # fmt: skip
@click.option("--driver", help="[default: the capsule's]")
@click.option("--provider", help="[default: the capsule's]")
@click.option(
    "--model-path", type=click.Path(),  # a string: click's Path("") would be the cwd
    help="The checkpoint (needed by provider recovery and driver n580).",
)  # fmt: skip
@click.option("--serve-as", help="Name the served engine for status/stop [default: NAME].")
@click.option(
    "--replica", is_flag=True,
    help="Restore into PID and network namespaces of its own, beside a running restore of the "
    "capsule (give it its own --port and --serve-as).",
)  # fmt: skip
@click.option("--print-request", is_flag=True, help="Print the request JSON and exit.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line (docs/cli.md).")
@click.option(
    "--recipe", type=click.Path(dir_okay=False, path_type=Path),
    help="A YAML recipe: the request file's content as YAML.",
)  # fmt: skip
@click.pass_context
def restore(
    ctx: click.Context,
    target: str | None,
    recipe: Path | None,
    engine_args: tuple[str, ...],
    port: int | None,
    host: str | None,
    print_request: bool,
    as_json: bool,
    serve_as: str | None,
    replica: bool,
    **options: Any,
) -> None:
    with reported(_debug):
        target = _one_source((target,) if target else (), recipe, "NAME or REQUEST_FILE")[0]
        key: str | None = None
        if _is_file(target):
            if given := _given(ctx, *_RESTORE_OPTIONS[:-1]) or (["--"] if engine_args else []):
                raise click.UsageError(
                    f"{', '.join(given)}: a request file says this itself (only --port, "
                    "--host, --replica, --serve-as and --json go with one)"
                )
            request = load(target)
            if not isinstance(request, RestoreRequest):
                raise RequestError([("kind", "`coldsnap restore` takes a restore request")])
            if port is not None or host is not None or replica:
                request = attrs.evolve(request, port=port or request.port,
                                       host=host or request.host,
                                       replica=replica or request.replica)  # fmt: skip
            args, key = split_key(request.engine_args, bare=True)  # a key written in the file
            request = attrs.evolve(request, engine_args=args)  # leaves it as from the command line
            check_key(request.engine_args, key, request.artifact, request.workdir)
        else:
            engine_args, key = split_key(engine_args)  # the key never joins the request
            request = _restore_request(
                target, engine_args, port=port, host=host, replica=replica, **options
            )
            check_key(request.engine_args, key, request.artifact)
        request, by_default = _listen_default(request)
        if print_request:
            click.echo(request_json(request))
            return
        name = serve_as or _serving.default_name(request.artifact)
        _check_free(name, request.port, request.host, by_default)
        _need_root("restore")
        if key is not None:
            give_key(request.workdir, key)
        with (
            _serving.taking(name, Path(request.workdir), request.artifact),  # records it too
            libraries_to_log(request.workdir),
            _watching(as_json) as subscriber,
            interrupts(request.workdir, events=as_json) as cancel,
        ):
            machine = Machine.for_request(request, subscribers=[subscriber])
            receipt = machine.restore(request, cancel=cancel)
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
        if not as_json:
            click.echo(
                f"serving {name} at {extra['url']} (pid {extra['pid']}); stop it with: "
                f"coldsnap stop {name}"
            )
    finish(receipt, extra, events=as_json)


def _one_source(given: tuple[str, ...], recipe: Path | None, what: str) -> tuple[str, ...]:
    """What the command reads its request from: `given`, or the recipe, never both."""
    if recipe is None:
        if not given:
            raise click.UsageError(f"give {what}, or --recipe FILE.yaml")
        return given
    if given:
        raise click.UsageError(f"--recipe: give {what} or a recipe, not both")
    name = str(recipe)
    if not name.endswith((".yaml", ".yml")):
        raise click.UsageError(f"--recipe: {name} must be a .yaml or .yml file")
    return (name,)


def _is_file(target: str) -> bool:
    """Whether `target` names a request file: `-` (stdin), or plainly a path by its spelling
    (a '/', a leading '.', a .json, .yaml or .yml ending); anything else is a capsule's tag or
    digest. Never by what the current directory holds: a file there named like the tag (in
    a directory others may write) must not choose what is restored."""
    return target == "-" or "/" in target or target.startswith(".") or target.endswith(
        (".json", ".yaml", ".yml"))  # fmt: skip


def _listen_default(request: RestoreRequest) -> tuple[RestoreRequest, bool]:
    """The request with the captured launch command line's port and host where it names none
    (a format-3 capture record carries them); and whether the port came from there."""
    from ._store_cmds import capture_record

    given = request.port is not None and request.host is not None
    if given or not Path(request.store).is_dir():
        return request, False
    try:
        record = capture_record(Store.open(request.store), request.artifact)
    except ColdsnapError:
        return request, False  # admission names what is wrong with the store or capsule
    if record is None or (record.serve_port is None and record.serve_host is None):
        return request, False
    port = request.port if request.port is not None else record.serve_port
    host = request.host if request.host is not None else record.serve_host
    return attrs.evolve(request, port=port, host=host), request.port is None and port is not None


def _check_free(name: str, port: int | None, host: str | None, by_default: bool) -> None:
    """Refuses, before anything starts, a name that is no name or a port in use (whether the
    name is free is checked when the restore takes it: _serving.taking)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", name):
        raise RequestError([("--serve-as", f"{name!r} is not a name (letters, digits, . _ -)")])
    if port is not None:
        try:
            check_port_free(host or "127.0.0.1", port)
        except PortInUse as exc:
            why = " (the captured command line's --port): pass --port" if by_default else ""
            raise RequestError([("port", f"{exc}{why}")]) from None


def _model_dir_needed(request: RestoreRequest) -> str | None:
    """Why this restore reads the model's directory, by its components' capabilities (None when
    it does not): a provider that reloads the checkpoint, or a driver that builds the engine at
    restore (the engine reads the model's config and tokenizer from it) rather than resuming
    the captured process. An unregistered component is the request check's to name."""
    if request.driver not in REGISTRY.names("driver"):
        return None
    if request.provider in REGISTRY.names("provider") and REGISTRY.restore_needs_model(request):
        return f"provider {request.provider} reloads the weights from its checkpoint"
    if "resumes_process" not in REGISTRY.capabilities("driver", request.driver):
        return (f"driver {request.driver} builds the engine at restore, which reads the model's "
                "config and tokenizer there")  # fmt: skip
    return None


def _restore_request(
    target: str,
    engine_args: tuple[str, ...],
    *,
    port: int | None,
    host: str | None,
    replica: bool,
    store: Path,
    workdir: Path | None,
    driver: str | None,
    provider: str | None,
    model_path: str | None,
) -> RestoreRequest:
    from coldsnap.capsules import RECORD_NAME, CaptureRecord

    from ._store_cmds import capsule_ref, capture_record

    store = store.expanduser().absolute()
    if not store.is_dir():
        raise RequestError([("--store", f"{store} is not a directory")])
    if model_path == "":
        raise RequestError([("--model-path", "is empty: name the checkpoint's directory")])
    opened = Store.open(store)
    target = capsule_ref(opened, target)  # a tag, a digest or the short digest `ls` prints
    record: CaptureRecord | None = capture_record(opened, target)
    if record is None:
        raise RequestError([("NAME", f"capsule {target} has no {RECORD_NAME}: use a request file")])
    driver, provider = driver or record.driver, provider or record.provider
    if engine_args and driver in REGISTRY.names("driver"):  # else the request check names it
        engine_args = set_over(record.engine_args, engine_args)
        check_honoured(engine_adapter(record.engine), driver, record.engine_args, engine_args)
    path = "" if model_path is None else str(Path(model_path).expanduser().resolve())
    tag = _tag_of(target.removeprefix("sha256:")[:12] if target.startswith("sha256:") else target)

    def request(model: ModelRef | None) -> RestoreRequest:
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
            host=host,
            replica=replica,
        )

    if path or not record.model_id:
        return request(ModelRef(id=record.model_id, revision=record.revision, path=path)
                       if path else None)  # fmt: skip
    if record.revision == LOCAL_REVISION:  # no hub id: the Hugging Face cache cannot hold it
        fallback = request(None)
        if (why := _model_dir_needed(fallback)) is not None:
            raise RequestError([("--model-path", f"capsule {target} was captured from a local "
                                 f"directory (model {record.model_id!r}), which a capsule does "
                                 f"not name, and {why}: give that directory")])  # fmt: skip
        return fallback
    # The capsule's model from the Hugging Face cache where it is there. Whether this restore
    # needs the checkpoint is for the check of its components, which names `model` when it is
    # missing; why the cache has none is then said beside it.
    try:
        return request(ModelRef(id=record.model_id, revision=record.revision))
    except RequestError as exc:
        if not any(f.startswith("model.") for f in exc.fields):
            raise
        not_cached = exc
    fallback = request(None)
    try:
        REGISTRY.check(fallback)  # names `model` where the provider needs the checkpoint
    except RequestError as exc:
        if "model" not in exc.fields:
            raise
        raise RequestError([*exc.problems, *not_cached.problems]) from None
    return fallback


__all__ = ["DEFAULT_STORE", "capture", "load", "print_event", "request_json", "restore"]
