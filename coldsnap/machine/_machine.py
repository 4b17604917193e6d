"""`Machine`: the public face, embedded by orchestrators with their own components."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from ._convert import parse_request, unstructure
from ._errors import JournalError, MachineBusy, RequestError
from ._host import check_host
from ._journal import JOURNAL_NAME, Journal, Replay, workdir_lock
from ._protocols import ArtifactStore, Driver, Engine, WeightProvider, check_components
from ._receipt import RECEIPT_NAME, Receipt
from ._registry import REGISTRY, Components, Registry
from ._requests import (
    CaptureRequest,
    LifecycleRequest,
    Request,
    RestoreRequest,
    SleepRequest,
    StopRequest,
    WakeRequest,
)
from ._runner import Run, Subscriber
from ._spec import Spec
from ._targets import lifecycle_request, read_receipt, seeds_of, target_lock

R = TypeVar("R", CaptureRequest, RestoreRequest, StopRequest, SleepRequest, WakeRequest)


class Machine:
    """Runs capture, restore, stop, sleep and wake specs against pluggable components.

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
        dry_run: bool = False,
    ) -> None:
        """`dry_run` marks operations run with components that touch no real process (test
        doubles, rehearsals): their journals say so, and only a dry-run Machine resumes them."""
        self.components: dict[str, Any] = Components(
            driver=driver, provider=provider, engine=engine, artifacts=artifacts
        ).by_role()
        self.registry = registry
        self._subscribers: list[Subscriber] = list(subscribers)
        self._grace_s = grace_s
        self.dry_run = dry_run
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

    def stop(
        self,
        request: StopRequest | Mapping[str, Any] | Receipt,
        *,
        cancel: threading.Event | None = None,
    ) -> Receipt:
        """Stops the engine a finished restore (or capture) left running: the driver's stop
        spec, journaled in the request's own workdir and holding the target's lock too.

        Given a Receipt instead of a request, stops its workdir's engine (`stop_receipt`)."""
        if isinstance(request, Receipt):
            return self.stop_receipt(request, cancel=cancel)
        return self._start(_coerce(request, StopRequest), cancel)

    def stop_receipt(
        self,
        receipt: Receipt,
        *,
        workdir: str | Path | None = None,
        timeouts: Mapping[str, float] | None = None,
        cancel: threading.Event | None = None,
    ) -> Receipt:
        """For embedders who hold a receipt: stops the engine of the operation in
        `receipt.workdir`, journaled in `workdir` (default: the next free
        `<target>/ops/stop-<n>`, `op_workdir`). The components are those of the target's
        request; this Machine's must be the same ones."""
        request = lifecycle_request(
            "stop", receipt.workdir, workdir=workdir, timeouts=timeouts or {}
        )
        return self._start(request, cancel)

    def sleep(
        self, request: SleepRequest | Mapping[str, Any], *, cancel: threading.Event | None = None
    ) -> Receipt:
        """Releases a running engine's memory without a snapshot: the engine's sleep spec."""
        return self._start(_coerce(request, SleepRequest), cancel)

    def wake(
        self, request: WakeRequest | Mapping[str, Any], *, cancel: threading.Event | None = None
    ) -> Receipt:
        """Gives a sleeping engine its memory back: the engine's wake spec."""
        return self._start(_coerce(request, WakeRequest), cancel)

    async def capture_async(self, request: CaptureRequest | Mapping[str, Any]) -> Receipt:
        return await self._in_thread(self.capture, request)

    async def restore_async(self, request: RestoreRequest | Mapping[str, Any]) -> Receipt:
        return await self._in_thread(self.restore, request)

    def resume(self, workdir: str | Path, *, cancel: threading.Event | None = None) -> Receipt:
        """Continues (or compensates) the operation journaled in `workdir`, holding its lock.

        Refused (JournalError) when the journal names other components, or another dry-run
        mode, than this Machine's: a resume acts only on what the operation itself started."""
        workdir = Path(workdir)
        if not (workdir / JOURNAL_NAME).exists():
            raise JournalError(f"no journal at {workdir / JOURNAL_NAME}")
        with workdir_lock(workdir):
            journal, records = Journal.reopen(workdir)
            replay = Replay.of(records)
            receipt_path = workdir / RECEIPT_NAME
            if replay.end is not None and receipt_path.exists():
                return read_receipt(workdir)
            request = parse_request(replay.request)
            with target_lock(request):
                return self._resume(request, journal, replay, cancel)

    def _resume(
        self,
        request: Request,
        journal: Journal,
        replay: Replay,
        cancel: threading.Event | None,
    ) -> Receipt:
        self.registry.check(request)
        spec = self.registry.spec(request.operation, request)
        if spec.name != replay.spec:
            owner = getattr(request, spec.owner_kind)
            raise JournalError(
                f"{journal.path}: names spec {replay.spec!r}, but {spec.owner_kind} "
                f"'{owner}' registers '{spec.name}' for {request.operation}"
            )
        self._check_journaled(journal.path, replay)
        check_components(spec, request, self.components)
        _check_selection(journal.path, spec, request, replay, self.components)
        with self._running(cancel) as event:
            run = self._run(spec, request, journal, event)
            if replay.end is not None:
                return run.finished(replay)
            return run.resume(replay)

    def _names(self) -> dict[str, str]:
        return {role: str(c.name) for role, c in self.components.items()}

    def _check_journaled(self, path: Path, replay: Replay) -> None:
        problems = []
        if replay.dry_run != self.dry_run:
            mode = {True: "a dry run", False: "not a dry run"}
            problems.append(
                f"the operation was {mode[replay.dry_run]}, this machine's is {mode[self.dry_run]}"
            )
        names = self._names()
        for role in sorted(set(replay.components) | set(names)):
            was, now = replay.components.get(role), names.get(role)
            if was != now:
                problems.append(f"{role}: journaled {was!r}, this machine {now!r}")
        if problems:
            raise JournalError(
                f"{path}: refusing to resume with other components than those that started "
                "the operation: " + "; ".join(problems)
            )

    def cancel(self) -> None:
        """Asks the running operation to stop; it compensates and returns its receipt."""
        if self._cancel is not None:
            self._cancel.set()

    # -- plumbing -----------------------------------------------------------------------------

    def _start(self, request: Request, cancel: threading.Event | None) -> Receipt:
        self.registry.check(request)
        spec = self.registry.spec(request.operation, request)
        check_components(spec, request, self.components)
        # What the host lacks is known now (a CRIU that is not there), not minutes later at the
        # step that first calls it: refused before any lock, journal or process. A resume is
        # not asked: what it compensates must stay possible on whatever host it runs on.
        check_host(request, self.components)
        workdir = Path(request.workdir)
        with target_lock(request):
            # The target is checked before the op's workdir exists: a refused op leaves nothing.
            seeds = seeds_of(spec, request) if isinstance(request, LifecycleRequest) else None
            with workdir_lock(workdir):
                journal = Journal.create(workdir)
                with self._running(cancel) as event:
                    return self._run(spec, request, journal, event).start(
                        unstructure(request),
                        components=self._names(),
                        dry_run=self.dry_run,
                        seeds=seeds,
                    )

    def _run(self, spec: Spec, request: Request, journal: Journal, cancel: threading.Event) -> Run:
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
            raise MachineBusy("this Machine is already running an operation")
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


def _check_selection(
    path: Path, spec: Spec, request: Request, replay: Replay, components: Mapping[str, Any]
) -> None:
    """Refuses a resume whose components' capabilities select other steps than those of the
    run it resumes (a driver rebuilt without CUDA would skip the CUDA restore of a process
    the run checkpointed): the journal's capabilities decide what the run was."""
    journaled = {
        role: SimpleNamespace(
            name=components[role].name, capabilities=frozenset(replay.capabilities.get(role, ()))
        )
        for role in components
    }
    was = [s.name for s in spec.selected(request, journaled)]
    now = [s.name for s in spec.selected(request, components)]
    if was == now:
        return
    gone = [n for n in was if n not in now]
    new = [n for n in now if n not in was]
    changed = {
        role: (sorted(replay.capabilities.get(role, ())), sorted(c.capabilities))
        for role, c in components.items()
        if frozenset(replay.capabilities.get(role, ())) != c.capabilities
    }
    raise JournalError(
        f"{path}: refusing to resume: this machine's components would run other steps than "
        f"the run selected (left out now: {', '.join(gone) or 'none'}; selected now, not "
        f"then: {', '.join(new) or 'none'}); capabilities "
        "journaled -> now: "
        + "; ".join(f"{role} {was_} -> {now_}" for role, (was_, now_) in changed.items())
    )
