"""Requests (capture, restore, and stop, sleep and wake of what they left running): what an
orchestrator asks for, validated before any side effect."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from attrs import field, frozen

from ._errors import RequestError
from ._models import find_snapshot

REQUEST_FORMAT = 1
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HOST_PATH = re.compile(r"^(/|~|\.{1,2}(/|$)|[A-Za-z]:[\\/]|\\\\)")
"""A value that names a file on this host (absolute, home-relative, `.`/`..`-relative, or a
Windows drive or share): a capsule records the model's id and revision for every host, so they
must not be one (the store refuses them at seal; a request refuses them before anything
starts)."""


@frozen(kw_only=True)
class ModelRef:
    """A model pinned by id and revision, with where its checkpoint lies on this host. Without
    a path, `id` is a Hugging Face repo id found in the local cache (never downloaded): a
    request then holds the snapshot's path and its commit hash as the revision (_models)."""

    id: str
    revision: str
    path: str = ""


def _from_hub(model: ModelRef) -> ModelRef:
    if model.path or not model.id or not model.revision:
        return model  # a local checkpoint, or a problem that validation names
    snapshot = find_snapshot(model.id, model.revision)
    return ModelRef(id=model.id, revision=snapshot.commit, path=str(snapshot.path))


def _from_hub_or_none(model: ModelRef | None) -> ModelRef | None:
    return None if model is None else _from_hub(model)


def _as_tuple(value: Any) -> tuple[str, ...]:
    return tuple(value)


def _as_timeouts(value: Mapping[str, float]) -> dict[str, float]:
    return dict(value)


def _as_options(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


@frozen(kw_only=True)
class CaptureRequest:
    """Capture an engine serving `model` into a capsule in `store`."""

    KIND: ClassVar[str] = "coldsnap.capture-request"
    operation: ClassVar[str] = "capture"

    driver: str
    provider: str
    model: ModelRef = field(converter=_from_hub)
    workdir: str
    store: str
    name: str = ""
    engine: str = "sglang"
    engine_args: tuple[str, ...] = field(default=(), converter=_as_tuple)
    engine_options: dict[str, str] = field(factory=dict, converter=_as_options)
    """The engine's own knobs by name, as strings: the engine adapter says which it knows and
    what each accepts (Registry.check asks it, naming `engine_options.<key>`), and writes every
    one into the engine's environment itself, so the orchestrator's environment does not
    decide them. The capsule binds them; admission compares them like engine_args."""
    tp: int = 1
    keep_source: bool = False
    serve_port: int | None = None
    """Where the user's own launch command line served (its --port): restores serve there by
    default. The capture itself serves on a port coldsnap picks."""
    serve_host: str | None = None
    """The launch command line's --host (an IPv4 address): restores bind there by default."""
    draft: ModelRef | None = field(default=None, converter=_from_hub_or_none)
    """The speculative decoding draft model (engine_args name the algorithm): the launcher
    hands the engine its path, and the capsule binds it like the model."""
    async_cuda_graphs: bool = False
    """Serve eagerly first and capture the decode graphs at the first scheduler-idle boundary
    after a completed request (COLDSNAP_ASYNC_CUDA_GRAPHS; CUDA; draft graphs stay
    synchronous)."""
    timeouts: dict[str, float] = field(factory=dict, converter=_as_timeouts)
    format: int = REQUEST_FORMAT
    kind: str = "coldsnap.capture-request"

    def __attrs_post_init__(self) -> None:
        problems = _common_problems(self)
        problems += _model_problems("model", self.model)
        if self.name and not _TAG.match(self.name):
            problems.append(("name", f"'{self.name}' is not a tag (letters, digits, . _ -)"))
        if self.tp < 1:
            problems.append(("tp", f"must be at least 1, got {self.tp}"))
        problems += _listen_problems("serve_port", self.serve_port, "serve_host", self.serve_host)
        problems += _draft_problems(self)
        if problems:
            raise RequestError(problems)


@frozen(kw_only=True)
class RestoreRequest:
    """Restore the capsule `artifact` (a name or sha256 digest) from `store`."""

    KIND: ClassVar[str] = "coldsnap.restore-request"
    operation: ClassVar[str] = "restore"

    driver: str
    provider: str
    artifact: str
    workdir: str
    store: str
    model: ModelRef | None = field(default=None, converter=_from_hub_or_none)
    engine: str = "sglang"
    engine_args: tuple[str, ...] = field(default=(), converter=_as_tuple)
    engine_options: dict[str, str] = field(factory=dict, converter=_as_options)
    """The engine's own knobs by name (as CaptureRequest's): admission compares them with the
    capture's, as it does engine_args."""
    tp: int | None = None
    """The tensor-parallel size the caller expects; when set, a capsule captured with another
    is refused at admission."""
    port: int | None = None
    host: str | None = None
    """The IPv4 address the restored engine listens on (default: where it listened at
    capture, 127.0.0.1)."""
    draft: ModelRef | None = field(default=None, converter=_from_hub_or_none)
    """The captured speculative draft model, where this host holds it: a recovery reloads the
    draft from it, an engine a driver builds at restore is given it."""
    async_cuda_graphs: bool = False
    """An engine a driver builds at restore serves eagerly first and captures its decode graphs
    at the first scheduler-idle boundary after a completed request (CUDA)."""
    replica: bool = False
    """Restore into a PID namespace of its own, so the capsule's processes can run again while
    another restore of it (or the captured engine) holds the PIDs its image takes back; the
    driver must declare `pid_namespaces` (Registry.check). Give it its own port."""
    timeouts: dict[str, float] = field(factory=dict, converter=_as_timeouts)
    format: int = REQUEST_FORMAT
    kind: str = "coldsnap.restore-request"

    def __attrs_post_init__(self) -> None:
        problems = _common_problems(self)
        if not self.artifact or not (_TAG.match(self.artifact) or _is_digest(self.artifact)):
            problems.append(("artifact", "must be a capsule name or a sha256:<hex> digest"))
        if self.model is not None:  # whether the provider needs one: Registry.check
            problems += _model_problems("model", self.model)
        if self.tp is not None and self.tp < 1:
            problems.append(("tp", f"must be at least 1, got {self.tp}"))
        problems += _listen_problems("port", self.port, "host", self.host)
        problems += _draft_problems(self)
        if problems:
            raise RequestError(problems)


@frozen(kw_only=True)
class LifecycleRequest:
    """Stop, sleep or wake the engine a finished capture or restore left running.

    `target` is that operation's workdir: its receipt says the engine runs, and the facts the
    spec seeds come from it. `workdir` is this operation's own (its journal and receipt; the
    command line puts it under `<target>/ops/`). `driver`, `provider` and `engine` are copied
    from the target's request (`coldsnap.machine.lifecycle_request`), so the registry builds
    the same components and the Machine refuses others; so are `engine_options` (the adapter
    that started the engine is built again) and `model` and `draft`, where a step reads their
    checkpoints again (a wake from a pinned checkpoint verifies and reloads it). Their paths
    are not required to exist here: a stop must work after a model is gone."""

    KIND: ClassVar[str] = ""
    operation: ClassVar[str] = ""

    target: str
    workdir: str
    driver: str
    provider: str
    engine: str = "sglang"
    model: ModelRef | None = None
    draft: ModelRef | None = None
    engine_options: dict[str, str] = field(factory=dict, converter=_as_options)
    """The target's engine options (copied like `engine`: the adapter built for a lifecycle
    operation is the one that started the engine)."""
    timeouts: dict[str, float] = field(factory=dict, converter=_as_timeouts)
    format: int = REQUEST_FORMAT
    kind: str = ""

    def __attrs_post_init__(self) -> None:
        problems = _format_problems(self)
        problems += _path_problems("target", self.target, must_exist=True)
        if not os.path.isabs(self.workdir):  # its parents are made (`<target>/ops/` at first)
            problems.append(("workdir", f"must be an absolute path, got '{self.workdir}'"))
        elif os.path.normpath(self.workdir) == os.path.normpath(self.target):
            problems.append(("workdir", "must not be the target's own workdir (its journal)"))
        problems += _timeout_problems(self.timeouts)
        if problems:
            raise RequestError(problems)


@frozen(kw_only=True)
class StopRequest(LifecycleRequest):
    """Stop the engine (and whatever the driver left beside it) of `target`."""

    KIND: ClassVar[str] = "coldsnap.stop-request"
    operation: ClassVar[str] = "stop"
    kind: str = "coldsnap.stop-request"


@frozen(kw_only=True)
class SleepRequest(LifecycleRequest):
    """Release the running engine's weights and KV cache of `target`, without a snapshot."""

    KIND: ClassVar[str] = "coldsnap.sleep-request"
    operation: ClassVar[str] = "sleep"
    kind: str = "coldsnap.sleep-request"


@frozen(kw_only=True)
class WakeRequest(LifecycleRequest):
    """Give the sleeping engine of `target` its weights and KV cache back."""

    KIND: ClassVar[str] = "coldsnap.wake-request"
    operation: ClassVar[str] = "wake"
    kind: str = "coldsnap.wake-request"


Request = CaptureRequest | RestoreRequest | StopRequest | SleepRequest | WakeRequest


def _listen_problems(
    port_name: str, port: int | None, host_name: str, host: str | None
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if port is not None and not 0 < port < 65536:
        problems.append((port_name, f"must be 1..65535, got {port}"))
    if host is not None and host != "localhost":
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            problems.append((host_name, f"must be an IPv4 address, got {host!r}"))
    return problems


def _draft_problems(request: CaptureRequest | RestoreRequest) -> list[tuple[str, str]]:
    """The draft model's own fields. Whether engine_args name a draft (or any other flag
    coldsnap sets itself) is the engine adapter's to say: Registry.check asks it."""
    if request.draft is None:
        return []
    return _model_problems("draft", request.draft)


def _is_digest(value: str) -> bool:
    return bool(re.fullmatch(r"sha256:[0-9a-f]{64}", value))


def _common_problems(request: CaptureRequest | RestoreRequest) -> list[tuple[str, str]]:
    problems = _format_problems(request)
    problems += _path_problems("store", request.store, must_exist=False)
    if not request.workdir:
        problems.append(("workdir", "is missing"))
    elif not os.path.isabs(request.workdir):  # its parents are made with it (Journal.create)
        problems.append(("workdir", f"must be an absolute path, got '{request.workdir}'"))
    problems += _timeout_problems(request.timeouts)
    return problems


def _format_problems(request: Any) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if request.format != REQUEST_FORMAT:
        problems.append(("format", f"unsupported format {request.format} (known: 1)"))
    if request.kind != request.KIND:
        problems.append(("kind", f"expected '{request.KIND}', got '{request.kind}'"))
    return problems


def _timeout_problems(timeouts: Mapping[str, float]) -> list[tuple[str, str]]:
    """Each timeout is a finite positive number of seconds: NaN compares false with every
    deadline and infinity overflows the wait, so both would fail the step mid-run with the
    engine started. Whether each names a step is for the spec (Registry.check)."""
    return [
        (f"timeouts.{step}", f"must be a finite positive number of seconds, got {seconds!r}")
        for step, seconds in timeouts.items()
        if not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds <= 0
    ]


def _model_problems(prefix: str, model: ModelRef) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not model.id.strip():
        problems.append((f"{prefix}.id", "must not be empty"))
    if not model.revision.strip():
        problems.append((f"{prefix}.revision", "must pin a revision"))
    for name in ("id", "revision"):
        if _HOST_PATH.match(value := getattr(model, name)):
            why = "the capsule records it for every host, so name the model (a hub id or a name)"
            problems.append((f"{prefix}.{name}", f"{value!r} is a host path: {why}"))
    problems += _path_problems(f"{prefix}.path", model.path, must_exist=True)
    return problems


def _path_problems(name: str, value: str, *, must_exist: bool) -> list[tuple[str, str]]:
    if not value:
        return [(name, "is missing")]
    if not os.path.isabs(value):
        return [(name, f"must be an absolute path, got '{value}'")]
    if must_exist and not os.path.isdir(value):
        return [(name, f"'{value}' does not exist or is not a directory")]
    if not must_exist and not os.path.isdir(os.path.dirname(value.rstrip("/")) or "/"):
        return [(name, f"the parent of '{value}' does not exist")]
    return []
