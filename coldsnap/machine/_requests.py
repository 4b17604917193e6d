"""Capture and restore requests: what an orchestrator asks for, validated before any side effect."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from attrs import field, frozen

from ._errors import RequestError

REQUEST_FORMAT = 1
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@frozen(kw_only=True)
class ModelRef:
    """A model pinned by id and revision, with where its checkpoint lies on this host."""

    id: str
    revision: str
    path: str


def _as_tuple(value: Any) -> tuple[str, ...]:
    return tuple(value)


def _as_timeouts(value: Mapping[str, float]) -> dict[str, float]:
    return dict(value)


@frozen(kw_only=True)
class CaptureRequest:
    """Capture an engine serving `model` into a capsule in `store`."""

    KIND: ClassVar[str] = "coldsnap.capture-request"
    operation: ClassVar[str] = "capture"

    driver: str
    provider: str
    model: ModelRef
    workdir: str
    store: str
    name: str = ""
    engine: str = "sglang"
    engine_args: tuple[str, ...] = field(default=(), converter=_as_tuple)
    tp: int = 1
    keep_source: bool = False
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
    model: ModelRef | None = None
    engine: str = "sglang"
    engine_args: tuple[str, ...] = field(default=(), converter=_as_tuple)
    tp: int | None = None
    """The tensor-parallel size the caller expects; when set, a capsule captured with another
    is refused at admission."""
    port: int | None = None
    timeouts: dict[str, float] = field(factory=dict, converter=_as_timeouts)
    format: int = REQUEST_FORMAT
    kind: str = "coldsnap.restore-request"

    def __attrs_post_init__(self) -> None:
        problems = _common_problems(self)
        if not self.artifact or not (_TAG.match(self.artifact) or _is_digest(self.artifact)):
            problems.append(("artifact", "must be a capsule name or a sha256:<hex> digest"))
        if self.model is not None:
            problems += _model_problems("model", self.model)
        elif self.provider == "recovery":
            problems.append(("model", "the recovery provider needs the pinned checkpoint's path"))
        if self.tp is not None and self.tp < 1:
            problems.append(("tp", f"must be at least 1, got {self.tp}"))
        if self.port is not None and not 0 < self.port < 65536:
            problems.append(("port", f"must be 1..65535, got {self.port}"))
        if problems:
            raise RequestError(problems)


Request = CaptureRequest | RestoreRequest


def _is_digest(value: str) -> bool:
    return bool(re.fullmatch(r"sha256:[0-9a-f]{64}", value))


def _common_problems(request: CaptureRequest | RestoreRequest) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if request.format != REQUEST_FORMAT:
        problems.append(("format", f"unsupported format {request.format} (known: 1)"))
    if request.kind != request.KIND:
        problems.append(("kind", f"expected '{request.KIND}', got '{request.kind}'"))
    for name in ("workdir", "store"):
        problems += _path_problems(name, getattr(request, name), must_exist=False)
    for step, seconds in request.timeouts.items():
        if not isinstance(seconds, int | float) or seconds <= 0:
            problems.append((f"timeouts.{step}", f"must be a positive number, got {seconds!r}"))
    return problems


def _model_problems(prefix: str, model: ModelRef) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not model.id:
        problems.append((f"{prefix}.id", "must not be empty"))
    if not model.revision:
        problems.append((f"{prefix}.revision", "must pin a revision"))
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
