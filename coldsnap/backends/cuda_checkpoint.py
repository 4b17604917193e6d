"""The CUDA driver's process checkpoint API as a backend (cuda-bindings, no cuda-checkpoint binary).

A controller process moves another process's GPU state into that process's own host memory
(checkpoint) and back (restore) with `cuCheckpointProcess*` (measured on an H200). The controller
needs only `cuInit(0)`: no context, no device memory. The target goes
RUNNING -> lock -> LOCKED -> checkpoint -> CHECKPOINTED -> restore -> LOCKED -> unlock -> RUNNING;
a LOCKED process blocks in its next CUDA call, so one must never be left locked.

Every method reads the state first and does nothing when the process is already where the call
would take it, so a step that is retried or compensated twice is harmless. The tree helpers
compensate: if any process fails, every process they locked or checkpointed is restored and
unlocked before the error is raised.

The driver needs the target's own threads to answer: on the H200 machine a state query of a
process that CRIU restored stopped (SIGSTOP, `--leave-stopped`) did not return in 15 s, and
after SIGCONT the same process reported CHECKPOINTED and restored normally (a checkpointed
process runs, but blocks in its first CUDA call until it is restored and unlocked). So every
call here first refuses a stopped target instead of hanging: continue it before the CUDA
restore.

One seam: the `driver` module (`cuda.bindings.driver`). Unit tests pass an in-memory fake.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from attrs import frozen

from ._errors import BackendArgumentError, CudaCheckpointError

RUNNING, LOCKED, CHECKPOINTED, FAILED = "running", "locked", "checkpointed", "failed"
_STATE_NAMES = {
    "CU_PROCESS_STATE_RUNNING": RUNNING,
    "CU_PROCESS_STATE_LOCKED": LOCKED,
    "CU_PROCESS_STATE_CHECKPOINTED": CHECKPOINTED,
    "CU_PROCESS_STATE_FAILED": FAILED,
}


@frozen
class _Step:
    """One driver transition: the state it acts on, the states in which it is already done (a
    no-op), the driver call, and what to tell a caller who asks in any other state."""

    acts_on: str
    done: tuple[str, ...]
    call: str
    hint: str = ""


_STEPS = {
    "lock": _Step(RUNNING, (LOCKED, CHECKPOINTED), "cuCheckpointProcessLock"),
    "checkpoint": _Step(LOCKED, (CHECKPOINTED,), "cuCheckpointProcessCheckpoint", "lock it first"),
    "restore": _Step(CHECKPOINTED, (LOCKED, RUNNING), "cuCheckpointProcessRestore"),
    "unlock": _Step(LOCKED, (RUNNING,), "cuCheckpointProcessUnlock", "restore it first"),
}
REQUIRED_API = (
    "cuInit",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "CUcheckpointLockArgs",
    "CUprocessState",
    "CUresult",
)


def is_stopped(pid: int) -> bool:
    """True when `pid` is stopped by a signal or a tracer (/proc state T or t)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _load_driver() -> Any:
    from cuda.bindings import driver  # type: ignore[import-not-found]

    return driver


class CudaCheckpoint:
    """The checkpoint API of one CUDA driver. `driver` defaults to `cuda.bindings.driver`,
    imported and initialised (cuInit(0)) on first use. `stopped` says whether a pid is
    stopped (default: /proc); the driver is never asked about a stopped process."""

    def __init__(
        self, driver: Any | None = None, *, stopped: Callable[[int], bool] = is_stopped
    ) -> None:
        self._driver = driver
        self._stopped = stopped
        self._initialised = False
        self._init_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CudaCheckpoint(driver={getattr(self._driver, '__name__', self._driver)!r})"

    # -- what is there -------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the API cannot be used here (no bindings, no driver or GPU, driver too old),
        or None when it can. Never raises."""
        try:
            self._ready()
        except CudaCheckpointError as exc:
            return str(exc)
        except Exception as exc:  # an unusable install can fail in any way; say how
            return f"cuda checkpoint API unusable: {type(exc).__name__}: {exc}"
        return None

    def available(self) -> bool:
        """True when bindings import, cuInit(0) succeeds and the checkpoint API is present.
        False on a machine without an NVIDIA driver; never raises."""
        return self.problem() is None

    def _ready(self) -> Any:
        with self._init_lock:
            if self._driver is None:
                try:
                    self._driver = _load_driver()
                except ImportError as exc:
                    raise CudaCheckpointError(
                        "init", None, f"cuda-bindings is not importable ({exc})"
                    ) from None
            driver = self._driver
            if not self._initialised:
                missing = [name for name in REQUIRED_API if not hasattr(driver, name)]
                if missing:
                    raise CudaCheckpointError(
                        "init",
                        None,
                        "the driver bindings lack the checkpoint API "
                        f"({', '.join(missing)}); it needs driver r570+ and cuda-bindings 12.8+",
                    )
                (err,) = _as_tuple(driver.cuInit(0))
                if not _ok(driver, err):
                    raise CudaCheckpointError(
                        "init", None, "cuInit(0) failed", result=_name(driver, err)
                    )
                self._initialised = True
            return driver

    # -- one process ---------------------------------------------------------------------

    def state(self, pid: int) -> str:
        """'running', 'locked', 'checkpointed' or 'failed'. Raises CudaCheckpointError when
        the driver knows no CUDA process `pid` (see has_context), or when the process is
        stopped (the driver would wait for it forever)."""
        driver = self._ready()
        if self._stopped(int(pid)):
            raise CudaCheckpointError(
                "get-state", pid, "the process is stopped (SIGSTOP or a tracer); the driver "
                "cannot reach it until it runs: send SIGCONT first (a checkpointed process "
                "blocks in its first CUDA call until it is restored and unlocked)",
            )  # fmt: skip
        err, value = _as_tuple(driver.cuCheckpointProcessGetState(int(pid)))
        if not _ok(driver, err):
            raise CudaCheckpointError(
                "get-state", pid, "the driver has no CUDA state for it", result=_name(driver, err)
            )
        return _state_name(driver, value)

    def has_context(self, pid: int) -> bool:
        """True when the driver reports a checkpoint state for `pid`, that is when the process
        has initialised CUDA. False for a process without CUDA, or one that is gone; raises
        for a stopped process (unknowable without waking it)."""
        try:
            self.state(pid)
        except CudaCheckpointError as exc:
            if exc.operation == "init" or self._stopped(int(pid)):
                raise
            return False
        return True

    def lock(self, pid: int, timeout_s: float = 30.0) -> str:
        """RUNNING -> LOCKED: waits up to timeout_s for the process's queued GPU work and
        blocks its further CUDA calls. A timeout leaves it RUNNING and raises (CUresult
        CUDA_ERROR_NOT_READY here). No-op when it is already LOCKED or CHECKPOINTED.
        Returns the state before the call."""
        if timeout_s < 0:
            raise BackendArgumentError(f"timeout_s: {timeout_s} is negative")

        def args(driver: Any) -> Any:
            lock_args = driver.CUcheckpointLockArgs()
            # 0 means "no timeout" to the driver; never let a rounding make it that.
            lock_args.timeoutMs = max(1, round(timeout_s * 1000)) if timeout_s else 0
            return lock_args

        return self._step("lock", pid, args)

    def checkpoint(self, pid: int) -> str:
        """LOCKED -> CHECKPOINTED: device memory moves into the process's host memory and the
        GPU is released. No-op when CHECKPOINTED; refuses a RUNNING process (lock first)."""
        return self._step("checkpoint", pid)

    def restore(self, pid: int) -> str:
        """CHECKPOINTED -> LOCKED: device memory comes back at the same addresses. No-op when
        the process is LOCKED or RUNNING (nothing is checkpointed)."""
        return self._step("restore", pid)

    def unlock(self, pid: int) -> str:
        """LOCKED -> RUNNING. No-op when RUNNING; refuses a CHECKPOINTED process (restore
        first)."""
        return self._step("unlock", pid)

    # -- process trees -------------------------------------------------------------------

    def cuda_pids(self, pids: Iterable[int]) -> list[int]:
        """The members of `pids` that have CUDA state, in order, each once."""
        return [pid for pid in dict.fromkeys(int(p) for p in pids) if self.has_context(pid)]

    def lock_all(self, pids: Iterable[int], timeout_s: float = 30.0) -> list[int]:
        """Locks every CUDA process of `pids` (processes without CUDA are skipped). If one
        fails, those this call locked are unlocked again before the error is raised. Returns
        the CUDA pids."""
        targets = self.cuda_pids(pids)
        locked: list[int] = []
        try:
            for pid in targets:
                if self.lock(pid, timeout_s) == RUNNING:
                    locked.append(pid)
        except BaseException as exc:
            for note in self._compensate([], locked):
                exc.add_note(note)
            raise
        return targets

    def checkpoint_all(
        self, pids: Iterable[int], lock_timeout_s: float = 30.0, *, parallel: bool = True
    ) -> list[int]:
        """Locks every CUDA process of `pids` (processes without CUDA are skipped), then
        checkpoints them (in parallel threads when `parallel`): no process moves until all
        are frozen. Returns the CUDA pids.

        On any failure, what this call did is undone before the first error is raised: each
        process it checkpointed is restored, each it locked is unlocked (a process that was
        already locked when the call began is left locked, as it was found). Compensation
        failures are attached to the error as notes."""
        targets = self.cuda_pids(pids)
        locked: list[int] = []
        checkpointed: list[int] = []
        progress = threading.Lock()

        def checkpoint(pid: int) -> None:
            if self.checkpoint(pid) == LOCKED:
                with progress:
                    checkpointed.append(pid)

        try:
            for pid in targets:
                if self.lock(pid, lock_timeout_s) == RUNNING:
                    locked.append(pid)
            self._each("checkpoint", targets, checkpoint, parallel)
        except BaseException as exc:
            # A checkpoint that failed half-way may have left its process CHECKPOINTED
            # without returning: restore whatever is checkpointed among the targets.
            for pid in targets:
                if pid not in checkpointed and self._state_or_none(pid) == CHECKPOINTED:
                    checkpointed.append(pid)
            for note in self._compensate(checkpointed, locked):
                exc.add_note(note)
            raise
        return targets

    def restore_all(self, pids: Iterable[int], *, parallel: bool = True) -> list[int]:
        """Restores every checkpointed process of `pids` (the CUDA pids checkpoint_all
        returned; in parallel threads when `parallel`), then unlocks them all, also when some
        restore failed, so that no process that could run stays locked. A pid without CUDA
        state is an error here. The first error is raised at the end, the others as notes.
        Returns the pids."""
        targets = list(dict.fromkeys(int(p) for p in pids))
        errors: list[BaseException] = []
        try:
            self._each("restore", targets, self.restore, parallel)
        except BaseException as exc:
            errors.append(exc)
        for pid in targets:
            if self._state_or_none(pid) == LOCKED:
                errors += _attempt_each([pid], self.unlock)
        _raise_first(errors)
        return targets

    # -- plumbing ------------------------------------------------------------------------

    def _step(self, operation: str, pid: int, args: Callable[[Any], Any] | None = None) -> str:
        """Reads the state; makes the driver call of `operation` (with `args(driver)`) only in
        the state it acts on, does nothing where it is already done, and refuses any other
        state, the driver's FAILED included. Returns the state before the call."""
        step = _STEPS[operation]
        state = self.state(pid)
        if state in step.done:
            return state
        if state == FAILED:
            problem = "the process is in the driver's FAILED state"
            raise CudaCheckpointError(operation, pid, problem, state=state)
        if state != step.acts_on:
            hint = f": {step.hint}" if step.hint else ""
            problem = f"cannot {operation} a {state} process{hint}"
            raise CudaCheckpointError(operation, pid, problem, state=state)
        driver = self._ready()
        call = getattr(driver, step.call)
        (err,) = _as_tuple(call(int(pid), args(driver) if args else None))[:1]
        if not _ok(driver, err):
            refused = "the driver refused"
            result, now = _name(driver, err), self._state_or_none(pid)
            raise CudaCheckpointError(operation, pid, refused, result=result, state=now)
        return state

    def _each(
        self, operation: str, pids: list[int], fn: Callable[[int], Any], parallel: bool
    ) -> None:
        """fn(pid) for each pid, in threads when `parallel`; waits for all, raises the first
        error (the others as notes)."""
        if not parallel or len(pids) < 2:
            for pid in pids:
                fn(pid)
            return
        with ThreadPoolExecutor(len(pids), thread_name_prefix=f"coldsnap-cuda-{operation}") as ex:
            futures = [ex.submit(fn, pid) for pid in pids]
        _raise_first([e for e in (f.exception() for f in futures) if e is not None])

    def _state_or_none(self, pid: int) -> str | None:
        try:
            return self.state(pid)
        except CudaCheckpointError:
            return None

    def _compensate(self, checkpointed: list[int], locked: list[int]) -> list[str]:
        """Restores `checkpointed`, then unlocks `locked`; one note per step that failed."""
        notes = [f"compensation: {e}" for e in _attempt_each(checkpointed, self.restore)]
        notes += [f"compensation: {e}" for e in _attempt_each(locked, self.unlock)]
        return notes


def _attempt_each(pids: Iterable[int], fn: Callable[[int], Any]) -> list[BaseException]:
    errors: list[BaseException] = []
    for pid in pids:
        try:
            fn(pid)
        except Exception as exc:
            errors.append(exc)
    return errors


def _raise_first(errors: list[BaseException]) -> None:
    if errors:
        for other in errors[1:]:
            errors[0].add_note(f"also: {other}")
        raise errors[0]


def _as_tuple(value: Any) -> tuple[Any, ...]:
    """cuda-bindings returns (CUresult, value...) or, for a call with no value, (CUresult,)."""
    return tuple(value) if isinstance(value, tuple | list) else (value,)


def _ok(driver: Any, err: Any) -> bool:
    return err == driver.CUresult.CUDA_SUCCESS


def _name(driver: Any, err: Any) -> str:
    name = getattr(err, "name", None)
    if isinstance(name, str):
        return name
    try:
        return driver.CUresult(err).name
    except Exception:
        return f"CUresult {int(err)}"


def _state_name(driver: Any, value: Any) -> str:
    name = getattr(value, "name", None)
    if not isinstance(name, str):
        try:
            name = driver.CUprocessState(value).name
        except Exception:
            name = None
    if name not in _STATE_NAMES:
        raise CudaCheckpointError("get-state", None, f"unknown process state {value!r}")
    return _STATE_NAMES[name]
