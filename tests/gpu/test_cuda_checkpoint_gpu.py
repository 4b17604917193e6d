"""The CUDA checkpoint backend against the real driver: a child process holding GPU tensors is
locked, checkpointed, restored and unlocked; its data and device addresses survive."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from coldsnap.backends import CudaCheckpoint, CudaCheckpointError

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("host")]

CHILD = textwrap.dedent(
    """
    import sys, torch
    x = torch.arange(64 << 20, dtype=torch.float32, device="cuda")  # 256 MiB
    want = float(x.double().sum())
    print(x.data_ptr(), flush=True)
    for line in sys.stdin:  # one line per check: answer the sum and the address
        torch.cuda.synchronize()
        print(float(x.double().sum()) == want, x.data_ptr(), flush=True)
    """
)


@pytest.fixture
def child():
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    ptr = proc.stdout.readline().strip()
    assert ptr, "the child did not start"
    yield proc, ptr
    proc.kill()
    proc.wait()


def ask(proc) -> list[str]:
    proc.stdin.write("check\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


@pytest.fixture(scope="module")
def cuda() -> CudaCheckpoint:
    found = CudaCheckpoint()
    if not found.available():
        pytest.skip(f"no CUDA checkpoint API: {found.problem()}")
    return found


def test_cycle_keeps_data_and_addresses(cuda, child):
    proc, ptr = child
    assert cuda.has_context(proc.pid)
    assert cuda.state(proc.pid) == "running"
    cuda.lock(proc.pid, 10)
    cuda.lock(proc.pid, 10)  # idempotent
    assert cuda.state(proc.pid) == "locked"
    cuda.checkpoint(proc.pid)
    assert cuda.state(proc.pid) == "checkpointed"
    with pytest.raises(CudaCheckpointError, match="restore it first"):
        cuda.unlock(proc.pid)
    cuda.restore(proc.pid)
    assert cuda.state(proc.pid) == "locked"
    cuda.unlock(proc.pid)
    cuda.unlock(proc.pid)
    assert cuda.state(proc.pid) == "running"
    assert ask(proc) == ["True", ptr]


def test_tree_helpers_skip_processes_without_cuda(cuda, child):
    proc, ptr = child
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert not cuda.has_context(sleeper.pid)
        pids = cuda.checkpoint_all([proc.pid, sleeper.pid], lock_timeout_s=10)
        assert pids == [proc.pid]
        assert cuda.state(proc.pid) == "checkpointed"
        assert cuda.restore_all(pids) == pids
        assert cuda.state(proc.pid) == "running"
        assert ask(proc) == ["True", ptr]
    finally:
        sleeper.kill()
        sleeper.wait()
