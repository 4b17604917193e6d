"""`Machine`: the public face, embedded by orchestrators with their own components."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ._context import StepContext
from ._convert import converter, parse_request, unstructure
from ._errors import JournalError, RequestError
from ._journal import Journal, Replay
from ._protocols import ArtifactStore, Driver, Engine, WeightProvider, check_components
from ._receipt import RECEIPT_NAME, Receipt
from ._registry import REGISTRY, Components, Registry
from ._requests import CaptureRequest, Request, RestoreRequest
from ._runner import Run, Subscriber
from ._spec import Step

R = TypeVar("R", CaptureRequest, RestoreRequest)


class Machine:
    """Runs capture and restore specs against pluggable components.

    One operation at a time per Machine. Every step is journaled in the request's workdir, so a
    new Machine given the same components can `resume(workdir)` an operation whose orchestrator
    died, and every failure compensates back to a safe state before the call returns.
    """

    def __init__(
        self,
        *,
        driver: Driver,
        provider: WeightProvider,
        engine: Engine,
        artifacts: ArtifactStore,
        subscribers: Iterable[Subscriber] = (),
        grace_s: float = 5.0,
        registry: Registry = REGISTRY,
    ) -> None:
        self.components: dict[str, Any] = Components(
            driver=driver, provider=provider, engine=engine, artifacts=artifacts
        ).by_role()
        self.registry = registry
        self._subscribers: list[Subscriber] = list(subscribers)
        self._grace_s = grace_s
        self._lock = threading.Lock()
        self._cancel: threading.Event | None = None

    @classmethod
    def for_request(
        cls,
        request: Request | Mapping[str, Any],
        *,
        registry: Registry = REGISTRY,
        **options: Any,
    ) -> Machine:
        """A Machine with the registered components the request names."""
        if isinstance(request, Mapping):
            request = parse_request(request)
        built = registry.components(request)
        return cls(**built.by_role(), registry=registry, **options)

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    # -- operations ---------------------------------------------------------------------------

    def capture(
        self, request: CaptureRequest | Mapping[str, Any], *, cancel: threading.Event | None = None
    ) -> Receipt:
        return self._start(_coerce(request, CaptureRequest), cancel)

    def restore(
        self, request: RestoreRequest | Mapping[str, Any], *, cancel: threading.Event | None = None
    ) -> Receipt:
        return self._start(_coerce(request, RestoreRequest), cancel)

    async def capture_async(self, request: CaptureRequest | Mapping[str, Any]) -> Receipt:
        return await self._in_thread(self.capture, request)

    async def restore_async(self, request: RestoreRequest | Mapping[str, Any]) -> Receipt:
        return await self._in_thread(self.restore, request)

    def resume(self, workdir: str | Path, *, cancel: threading.Event | None = None) -> Receipt:
        """Continues (or compensates) the operation journaled in `workdir`."""
        workdir = Path(workdir)
        journal, records = Journal.reopen(workdir)
        replay = Replay.of(records)
        if replay.end is not None:
            return _read_receipt(workdir)
        request = parse_request(replay.request)
        self.registry.check(request)
        spec = self.registry.spec(request.operation, request.driver)
        if spec.name != replay.spec:
            raise JournalError(
                f"{journal.path}: names spec {replay.spec!r}, but driver '{request.driver}' "
                f"registers '{spec.name}' for {request.operation}"
            )
        check_components(spec, request, self.components)
        with self._running(cancel) as event:
            return self._run(spec, request, journal, event).resume(replay)

    def cancel(self) -> None:
        """Asks the running operation to stop; it compensates and returns its receipt."""
        if self._cancel is not None:
            self._cancel.set()

    def stop(self, receipt: Receipt) -> None:
        """Stops what a restore (or a capture that kept its source) left running."""
        request = parse_request(_read_request(Path(receipt.workdir)))
        spec = self.registry.spec(request.operation, request.driver)
        step = Step("stop", "driver.stop_engine", "stop the engine", side_effect=False)
        ctx = StepContext(
            request=request,
            spec=spec,
            step=step,
            workdir=Path(request.workdir),
            deadline=time.monotonic() + 120.0,
            facts=dict(receipt.facts),
            cancel=threading.Event(),
            record=lambda facts: None,
            compensating=True,
        )
        self.components["driver"].stop_engine(ctx)

    # -- plumbing -----------------------------------------------------------------------------

    def _start(self, request: Request, cancel: threading.Event | None) -> Receipt:
        self.registry.check(request)
        spec = self.registry.spec(request.operation, request.driver)
        check_components(spec, request, self.components)
        journal = Journal.create(Path(request.workdir))
        with self._running(cancel) as event:
            return self._run(spec, request, journal, event).start(unstructure(request))

    def _run(self, spec: Any, request: Request, journal: Journal, cancel: threading.Event) -> Run:
        return Run(
            spec=spec,
            request=request,
            components=self.components,
            journal=journal,
            cancel=cancel,
            subscribers=self._subscribers,
            grace_s=self._grace_s,
        )

    def _running(self, cancel: threading.Event | None) -> _Running:
        return _Running(self, cancel or threading.Event())

    async def _in_thread(self, fn: Callable[..., Receipt], request: Any) -> Receipt:
        # A cancelled caller must not leave a half-done operation behind: cancel the run, wait
        # for its compensation to finish, then let the cancellation through.
        event = threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(fn, request, cancel=event))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            event.set()
            await task
            raise


class _Running:
    def __init__(self, machine: Machine, event: threading.Event) -> None:
        self.machine = machine
        self.event = event

    def __enter__(self) -> threading.Event:
        if not self.machine._lock.acquire(blocking=False):
            raise RuntimeError("this Machine is already running an operation")
        self.machine._cancel = self.event
        return self.event

    def __exit__(self, *exc: object) -> None:
        self.machine._cancel = None
        self.machine._lock.release()


def _coerce(request: Any, cls: type[R]) -> R:
    if isinstance(request, Mapping):
        request = parse_request(request)
    if not isinstance(request, cls):
        raise RequestError([("kind", f"expected a {cls.KIND}, got {type(request).__name__}")])
    return request


def _read_receipt(workdir: Path) -> Receipt:
    data = json.loads((workdir / RECEIPT_NAME).read_text())
    return converter.structure(data, Receipt)


def _read_request(workdir: Path) -> dict[str, Any]:
    from ._journal import JOURNAL_NAME, read_journal

    return read_journal(workdir / JOURNAL_NAME)[0].request or {}
