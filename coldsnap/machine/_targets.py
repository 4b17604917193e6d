"""The targets of lifecycle operations (stop, sleep, wake): a finished capture's or restore's
workdir, read from disk as it is now (its receipt and journaled request), locked for the
operation's whole run, checked, and the facts a spec seeds from it; and the lifecycle request
built from it, journaled under `<target>/ops/<operation>-<n>`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ._convert import parse_request, structure_record
from ._errors import JournalError, RequestError
from ._journal import JOURNAL_NAME, read_journal, workdir_lock
from ._receipt import RECEIPT_NAME, Receipt
from ._requests import (
    CaptureRequest,
    LifecycleRequest,
    Request,
    SleepRequest,
    StopRequest,
    WakeRequest,
)
from ._spec import Spec


def read_receipt(workdir: Path) -> Receipt:
    path = workdir / RECEIPT_NAME
    try:
        return structure_record(json.loads(path.read_bytes()), Receipt, str(path))
    except ValueError as exc:  # not UTF-8 or not JSON
        raise JournalError(f"{path}: not a receipt ({exc})") from None


def _read_request(workdir: Path) -> dict[str, Any]:
    return read_journal(workdir / JOURNAL_NAME)[0].request or {}


@contextlib.contextmanager
def target_lock(request: Request) -> Iterator[None]:
    """A lifecycle operation holds its target's workdir lock for its whole run (beside its own):
    nothing else (a resume of the target, another stop, sleep or wake) acts on that engine
    meanwhile."""
    if not isinstance(request, LifecycleRequest):
        yield
        return
    target = Path(request.target)
    if not (target / JOURNAL_NAME).exists():
        raise RequestError([("target", f"{target}: no capture or restore journaled there")])
    with workdir_lock(target):
        yield


def _target(request: LifecycleRequest) -> tuple[Receipt, Request]:
    """The target's receipt and request, as on disk now; a RequestError naming `target` when
    there is no finished operation whose engine still runs."""
    target = Path(request.target)
    try:
        receipt = read_receipt(target)
        journaled = parse_request(_read_request(target))
    except FileNotFoundError:
        raise RequestError(
            [("target", f"{target}: its operation has no receipt (still running, or it died: "
              "resume it first)")]
        ) from None
    except (JournalError, RequestError) as exc:
        raise RequestError([("target", f"{target}: unreadable ({exc})")]) from None
    kept = isinstance(journaled, CaptureRequest) and journaled.keep_source
    if receipt.outcome != "done" and not kept:
        raise RequestError(
            [("target", f"{target}: its {receipt.operation} ended {receipt.outcome}, so no "
              "engine of it runs")]
        )
    if isinstance(journaled, LifecycleRequest):
        raise RequestError(
            [("target", f"{target}: a {journaled.operation}, not a capture or restore")]
        )
    problems = [
        (role, f"'{getattr(request, role)}', but the target ran with "
               f"'{getattr(journaled, role)}'")
        for role in ("driver", "provider", "engine")
        if getattr(request, role) != getattr(journaled, role)
    ]
    if problems:
        raise RequestError(problems)
    return receipt, journaled


def seeds_of(spec: Spec, request: LifecycleRequest) -> dict[str, Any]:
    """The facts the spec's steps take from the target: its `seeds`, where the target's
    receipt holds them."""
    receipt, _ = _target(request)
    return {f.name: receipt.facts[f.name] for f in spec.seeds if f.name in receipt.facts}


OPS_DIR = "ops"


def op_workdir(target: str | Path, operation: str) -> Path:
    """The next free workdir of a lifecycle operation on `target`:
    `<target>/ops/<operation>-<n>`, n counting from 1."""
    ops = Path(target) / OPS_DIR
    taken = {p.name for p in ops.glob(f"{operation}-*")} if ops.is_dir() else set()
    n = 1
    while f"{operation}-{n}" in taken:
        n += 1
    return ops / f"{operation}-{n}"


def lifecycle_request(
    operation: str,
    target: str | Path,
    *,
    workdir: str | Path | None = None,
    timeouts: Mapping[str, float] | None = None,
) -> LifecycleRequest:
    """A stop, sleep or wake request on `target` (a capture's or restore's workdir), naming the
    driver, provider and engine its request named (the registry then builds the same
    components), journaled in `workdir` (default: `op_workdir(target, operation)`)."""
    classes: dict[str, type[LifecycleRequest]] = {
        "stop": StopRequest, "sleep": SleepRequest, "wake": WakeRequest,
    }  # fmt: skip
    if operation not in classes:
        raise RequestError([("operation", f"'{operation}' is not one of {', '.join(classes)}")])
    target = Path(target)
    if not (target / JOURNAL_NAME).exists():
        raise RequestError([("target", f"{target}: no capture or restore journaled there")])
    journaled = parse_request(_read_request(target))
    return classes[operation](
        target=str(target),
        workdir=str(workdir or op_workdir(target, operation)),
        driver=journaled.driver,
        provider=journaled.provider,
        engine=journaled.engine,
        engine_options=dict(journaled.engine_options),
        model=journaled.model,
        draft=journaled.draft,
        timeouts=dict(timeouts or {}),
    )


__all__ = ["OPS_DIR", "lifecycle_request", "op_workdir", "read_receipt", "seeds_of", "target_lock"]
