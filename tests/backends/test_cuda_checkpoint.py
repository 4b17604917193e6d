"""The CUDA checkpoint backend against an in-memory fake of cuda-bindings' driver module.

The fake keeps the driver's state machine per pid (RUNNING -> LOCKED -> CHECKPOINTED ->
LOCKED -> RUNNING) and answers like cuda.bindings.driver: tuples led by a CUresult enum.
Failures are injected per (operation, pid). The real driver is qualified on the H200
(tests/gpu/, docs/qualification.md).
"""

from __future__ import annotations

import enum
import os
import pickle
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coldsnap._errors import OperationError
from coldsnap.backends import BackendError, CudaCheckpoint, CudaCheckpointError, cuda_checkpoint
from coldsnap.backends.cuda_checkpoint import is_stopped


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_STATE = 401


class CUprocessState(enum.IntEnum):
    CU_PROCESS_STATE_RUNNING = 0
    CU_PROCESS_STATE_LOCKED = 1
    CU_PROCESS_STATE_CHECKPOINTED = 2
    CU_PROCESS_STATE_FAILED = 3


S = CUprocessState


class CUcheckpointLockArgs:
    def __init__(self) -> None:
        self.timeoutMs = 0


class FakeDriver:
    """Stands in for `cuda.bindings.driver`."""

    CUresult = CUresult
    CUprocessState = CUprocessState
    CUcheckpointLockArgs = CUcheckpointLockArgs

    def __init__(self, pids: dict[int, S] | None = None, *, init: CUresult = CUresult.CUDA_SUCCESS):
        self.states: dict[int, S] = dict(pids or {})
        self.init_result = init
        self.calls: list[tuple[str, int]] = []
        self.lock_timeouts: list[int] = []
        # (operation, pid) -> (result, state to leave the process in, or None to keep it)
        self.failures: dict[tuple[str, int], tuple[CUresult, S | None]] = {}
        self.stopped: set[int] = set()  # pids the OS has stopped (SIGSTOP)
        self._lock = threading.Lock()

    def fail(self, operation: str, pid: int, result: CUresult, leave: S | None = None) -> None:
        self.failures[(operation, pid)] = (result, leave)

    def cuInit(self, flags: int) -> tuple[CUresult]:
        assert flags == 0
        return (self.init_result,)

    def cuCheckpointProcessGetState(self, pid: int) -> tuple[CUresult, Any]:
        # The real driver does not answer for a stopped process (seen on the H200 machine).
        assert pid not in self.stopped, "the driver was asked about a stopped process"
        with self._lock:
            if pid not in self.states:
                return (CUresult.CUDA_ERROR_NOT_FOUND, None)
            return (CUresult.CUDA_SUCCESS, self.states[pid])

    def _step(self, op: str, pid: int, need: S, to: S) -> tuple[CUresult]:
        with self._lock:
            self.calls.append((op, pid))
            if (op, pid) in self.failures:
                result, leave = self.failures.pop((op, pid))
                if leave is not None:
                    self.states[pid] = leave
                return (result,)
            if self.states.get(pid) != need:
                return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
            self.states[pid] = to
            return (CUresult.CUDA_SUCCESS,)

    def cuCheckpointProcessLock(self, pid: int, args: CUcheckpointLockArgs | None):
        self.lock_timeouts.append(args.timeoutMs if args is not None else 0)
        return self._step("lock", pid, S.CU_PROCESS_STATE_RUNNING, S.CU_PROCESS_STATE_LOCKED)

    def cuCheckpointProcessCheckpoint(self, pid: int, args: None):
        return self._step(
            "checkpoint", pid, S.CU_PROCESS_STATE_LOCKED, S.CU_PROCESS_STATE_CHECKPOINTED
        )

    def cuCheckpointProcessRestore(self, pid: int, args: None):
        return self._step(
            "restore", pid, S.CU_PROCESS_STATE_CHECKPOINTED, S.CU_PROCESS_STATE_LOCKED
        )

    def cuCheckpointProcessUnlock(self, pid: int, args: None):
        return self._step("unlock", pid, S.CU_PROCESS_STATE_LOCKED, S.CU_PROCESS_STATE_RUNNING)


RUNNING = S.CU_PROCESS_STATE_RUNNING
LOCKED = S.CU_PROCESS_STATE_LOCKED
CHECKPOINTED = S.CU_PROCESS_STATE_CHECKPOINTED
FAILED = S.CU_PROCESS_STATE_FAILED


def make(**pids: S) -> tuple[CudaCheckpoint, FakeDriver]:
    driver = FakeDriver({int(k.removeprefix("p")): v for k, v in pids.items()})
    return CudaCheckpoint(driver, stopped=lambda pid: pid in driver.stopped), driver


def states(driver: FakeDriver) -> dict[int, str]:
    return {
        pid: s.name.removeprefix("CU_PROCESS_STATE_").lower() for pid, s in driver.states.items()
    }


# -- availability -----------------------------------------------------------------------


def test_available_with_the_api_and_a_working_cuinit():
    cuda, _ = make()
    assert cuda.available()
    assert cuda.problem() is None


def test_cuinit_failure_makes_it_unavailable_without_raising():
    cuda = CudaCheckpoint(FakeDriver(init=CUresult.CUDA_ERROR_NO_DEVICE))
    assert not cuda.available()
    assert "CUDA_ERROR_NO_DEVICE" in (cuda.problem() or "")


def test_bindings_without_the_checkpoint_api_are_unavailable():
    class Old:
        CUresult = CUresult

        def cuInit(self, flags: int) -> tuple[CUresult]:
            return (CUresult.CUDA_SUCCESS,)

    cuda = CudaCheckpoint(Old())
    assert not cuda.available()
    assert "cuCheckpointProcessLock" in (cuda.problem() or "")


def test_a_stopped_process_is_refused_before_the_driver_is_asked():
    cuda, driver = make(p4=CHECKPOINTED)
    driver.stopped.add(4)
    for call in (cuda.state, cuda.has_context, cuda.restore, cuda.unlock):
        with pytest.raises(CudaCheckpointError, match="SIGCONT"):
            call(4)
    with pytest.raises(CudaCheckpointError, match="stopped"):
        cuda.restore_all([4])
    driver.stopped.clear()
    assert cuda.restore_all([4]) == [4]
    assert states(driver) == {4: "running"}


def test_is_stopped_reads_the_process_state():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert not is_stopped(sleeper.pid)
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not is_stopped(sleeper.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert is_stopped(sleeper.pid)
        os.kill(sleeper.pid, signal.SIGCONT)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not is_stopped(sleeper.pid)  # gone


def test_an_unusable_install_is_reported_not_raised(monkeypatch):
    """Missing bindings, or bindings that fail in an unexpected way, make `problem()` say why
    and `available()` False; neither raises."""

    def no_bindings():
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(cuda_checkpoint, "_load_driver", no_bindings)
    cuda = CudaCheckpoint()
    assert not cuda.available()
    assert cuda.problem() == "cuda init: cuda-bindings is not importable (No module named 'cuda')"

    class Broken(FakeDriver):
        def cuInit(self, flags: int) -> tuple[CUresult]:
            raise RuntimeError("libcuda.so: cannot open shared object file")

    cuda = CudaCheckpoint(Broken())
    assert not cuda.available()
    assert cuda.problem() == (
        "cuda checkpoint API unusable: RuntimeError: libcuda.so: cannot open shared object file"
    )


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="an NVIDIA driver is loaded here")
def test_the_real_bindings_say_why_they_are_unusable_without_a_driver():
    cuda = CudaCheckpoint()
    assert cuda.available() is False
    assert (cuda.problem() or "").startswith(("cuda init:", "cuda checkpoint API unusable:"))


# -- one process ------------------------------------------------------------------------


def test_state_names_and_has_context():
    cuda, _ = make(p1=RUNNING, p2=LOCKED, p3=CHECKPOINTED, p4=FAILED)
    assert [cuda.state(p) for p in (1, 2, 3, 4)] == ["running", "locked", "checkpointed", "failed"]
    assert cuda.has_context(1)
    assert not cuda.has_context(99)
    with pytest.raises(CudaCheckpointError, match="CUDA_ERROR_NOT_FOUND") as info:
        cuda.state(99)
    assert isinstance(info.value, BackendError)
    assert info.value.result == "CUDA_ERROR_NOT_FOUND"


def test_full_cycle_and_every_step_is_idempotent():
    cuda, driver = make(p7=RUNNING)
    for step, expect in [
        (lambda: cuda.lock(7, 5.0), "locked"),
        (lambda: cuda.checkpoint(7), "checkpointed"),
        (lambda: cuda.restore(7), "locked"),
        (lambda: cuda.unlock(7), "running"),
    ]:
        step()
        assert cuda.state(7) == expect
        step()  # again: a no-op
        assert cuda.state(7) == expect
    assert [op for op, _ in driver.calls] == ["lock", "checkpoint", "restore", "unlock"]
    assert driver.lock_timeouts == [5000]


def test_noops_in_states_already_past_the_step():
    cuda, driver = make(p1=CHECKPOINTED, p2=RUNNING)
    assert cuda.lock(1) == "checkpointed"  # a checkpointed process is locked already
    assert cuda.restore(2) == "running"  # nothing to restore
    assert cuda.unlock(2) == "running"
    assert driver.calls == []


def test_wrong_order_is_refused_with_the_state():
    cuda, driver = make(p1=RUNNING, p2=CHECKPOINTED, p3=FAILED)
    with pytest.raises(CudaCheckpointError, match="lock it first") as info:
        cuda.checkpoint(1)
    assert info.value.state == "running"
    with pytest.raises(CudaCheckpointError, match="restore it first"):
        cuda.unlock(2)
    for op in (cuda.lock, cuda.checkpoint, cuda.restore, cuda.unlock):
        with pytest.raises(CudaCheckpointError, match="FAILED"):
            op(3)
    assert driver.calls == []


def test_lock_timeout_leaves_running_and_names_the_result():
    cuda, driver = make(p5=RUNNING)
    driver.fail("lock", 5, CUresult.CUDA_ERROR_NOT_READY)
    with pytest.raises(CudaCheckpointError) as info:
        cuda.lock(5, 0.3)
    assert info.value.result == "CUDA_ERROR_NOT_READY"
    assert info.value.state == "running"
    assert driver.lock_timeouts == [300]
    cuda.lock(5, 30)  # the work drained: the second try locks
    assert cuda.state(5) == "locked"


def test_lock_timeout_is_never_rounded_to_no_timeout():
    cuda, driver = make(p5=RUNNING)
    cuda.lock(5, 0.0001)
    assert driver.lock_timeouts == [1]
    with pytest.raises(ValueError, match="timeout_s"):
        cuda.lock(5, -1)


# -- trees ------------------------------------------------------------------------------


def test_checkpoint_all_skips_processes_without_cuda_and_restore_all_undoes_it():
    cuda, driver = make(p10=RUNNING, p12=RUNNING)
    pids = cuda.checkpoint_all([10, 11, 12, 10], lock_timeout_s=2)
    assert pids == [10, 12]
    assert states(driver) == {10: "checkpointed", 12: "checkpointed"}
    locks = [c for c in driver.calls if c[0] == "lock"]
    first_checkpoint = driver.calls.index(next(c for c in driver.calls if c[0] == "checkpoint"))
    assert driver.calls.index(locks[-1]) < first_checkpoint  # all frozen before any moves
    assert cuda.restore_all(pids) == [10, 12]
    assert states(driver) == {10: "running", 12: "running"}
    assert cuda.restore_all(pids) == [10, 12]  # idempotent


@pytest.mark.parametrize("parallel", [True, False])
def test_checkpoint_failure_midway_restores_and_unlocks_everything(parallel):
    cuda, driver = make(p1=RUNNING, p2=RUNNING, p3=RUNNING)
    driver.fail("checkpoint", 2, CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(CudaCheckpointError, match="CUDA_ERROR_INVALID_VALUE"):
        cuda.checkpoint_all([1, 2, 3], parallel=parallel)
    assert states(driver) == {1: "running", 2: "running", 3: "running"}


def test_a_checkpoint_that_fails_half_done_is_restored_too():
    cuda, driver = make(p1=RUNNING, p2=RUNNING)
    driver.fail("checkpoint", 2, CUresult.CUDA_ERROR_INVALID_VALUE, leave=CHECKPOINTED)
    with pytest.raises(CudaCheckpointError):
        cuda.checkpoint_all([1, 2], parallel=False)
    assert states(driver) == {1: "running", 2: "running"}


def test_lock_failure_unlocks_the_ones_already_locked():
    cuda, driver = make(p1=RUNNING, p2=RUNNING, p3=RUNNING)
    driver.fail("lock", 3, CUresult.CUDA_ERROR_NOT_READY)
    with pytest.raises(CudaCheckpointError, match="CUDA_ERROR_NOT_READY"):
        cuda.checkpoint_all([1, 2, 3])
    assert states(driver) == {1: "running", 2: "running", 3: "running"}
    assert not any(op == "checkpoint" for op, _ in driver.calls)
    driver.fail("lock", 2, CUresult.CUDA_ERROR_NOT_READY)
    with pytest.raises(CudaCheckpointError):
        cuda.lock_all([1, 2, 3])
    assert states(driver) == {1: "running", 2: "running", 3: "running"}


def test_a_process_found_locked_is_left_locked_as_found():
    cuda, driver = make(p1=LOCKED, p2=RUNNING)
    driver.fail("checkpoint", 2, CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(CudaCheckpointError):
        cuda.checkpoint_all([1, 2], parallel=False)
    # pid 1 was checkpointed by the call, so it is restored; its lock was someone else's
    assert states(driver) == {1: "locked", 2: "running"}


def test_compensation_failures_are_attached_as_notes():
    cuda, driver = make(p1=RUNNING, p2=RUNNING)
    driver.fail("checkpoint", 2, CUresult.CUDA_ERROR_INVALID_VALUE)
    driver.fail("restore", 1, CUresult.CUDA_ERROR_ILLEGAL_STATE)
    with pytest.raises(CudaCheckpointError) as info:
        cuda.checkpoint_all([1, 2], parallel=False)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "compensation" in notes and "pid 1" in notes


def test_restore_all_unlocks_the_others_when_one_restore_fails():
    cuda, driver = make(p1=CHECKPOINTED, p2=CHECKPOINTED, p3=CHECKPOINTED)
    driver.fail("restore", 2, CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(CudaCheckpointError, match="pid 2"):
        cuda.restore_all([1, 2, 3])
    assert states(driver) == {1: "running", 2: "checkpointed", 3: "running"}


def test_restore_all_refuses_a_pid_without_cuda_state_but_still_unlocks_the_rest():
    cuda, driver = make(p1=CHECKPOINTED)
    with pytest.raises(CudaCheckpointError, match="pid 5"):
        cuda.restore_all([1, 5], parallel=False)
    assert states(driver) == {1: "running"}


def test_lock_all_locks_the_cuda_pids_and_restore_all_unlocks_them():
    cuda, driver = make(p1=RUNNING, p2=RUNNING)
    assert cuda.lock_all([1, 2, 3], 1.0) == [1, 2]
    assert states(driver) == {1: "locked", 2: "locked"}
    assert driver.lock_timeouts == [1000, 1000]
    assert cuda.restore_all([1, 2]) == [1, 2]  # nothing to restore: only unlocked
    assert states(driver) == {1: "running", 2: "running"}
    assert [op for op, _ in driver.calls] == ["lock", "lock", "unlock", "unlock"]


def test_errors_are_operation_errors_with_fields():
    cuda, _ = make(p1=RUNNING)
    with pytest.raises(OperationError) as info:
        cuda.checkpoint(1)
    error = info.value
    assert isinstance(error, CudaCheckpointError) and isinstance(error, BackendError)
    assert (error.operation, error.pid, error.state, error.result) == (
        "checkpoint",
        1,
        "running",
        None,
    )
    assert str(error) == (
        "cuda checkpoint pid 1: cannot checkpoint a running process: lock it first; "
        "process state running"
    )
    assert pickle.loads(pickle.dumps(error)).state == "running"
