"""A torch process that used bf16 (and so, on an AMX CPU, AMX tile data) keeps working after a
restore: CRIU does not restore the per-process AMX permission, and without our restorer patch
(scripts/criu-patches/) the next bf16 matmul dies with SIGILL."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from coldsnap.backends import Criu, launch, wait_gone

from .conftest import ask, target, wait_for_line

pytestmark = [
    pytest.mark.criu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
    pytest.mark.xdist_group("toys"),
]
XFEATURE_XTILEDATA = 1 << 18
REPORT = r"report got=(\S+) expected=(\S+) perm=(\S+)"


def _cpu_has_amx() -> bool:
    flags = next(
        (
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ),
        "",
    )
    return "amx_tile" in flags.split()


def test_bf16_matmul_after_restore(criu: Criu, tmp_path: Path) -> None:
    log = tmp_path / "amx.log"
    proc = launch(target("amx.py"), log_path=log)
    try:
        before = wait_for_line(log, REPORT, timeout=120)
        wait_for_line(log, "ready", timeout=60)
        criu.dump(proc.pid, tmp_path / "image")
    finally:
        proc.stop(timeout=5)
    assert float(before[1]) == float(before[2])

    tree = criu.restore(tmp_path / "image")
    try:
        after = ask(tree.pid, log, REPORT, timeout=60)
        assert float(after[1]) == float(after[2]), "wrong bf16 matmul result after restore"
        second = ask(tree.pid, log, REPORT, timeout=60)  # and it keeps working
        assert float(second[1]) == float(second[2])
    finally:
        criu.stop(tree, timeout=5)
        wait_gone(tree.pid, timeout=10)

    if not _cpu_has_amx():
        pytest.skip(
            "this CPU has no AMX: the bf16 process restored and computed correctly, but the "
            "AMX permission could not be checked"
        )
    perm_before, perm_after = int(before[3], 16), int(after[3], 16)
    print(f"XCOMP permission mask before dump {before[3]}, after restore {after[3]}")
    assert perm_before & XFEATURE_XTILEDATA, f"torch did not ask for AMX ({before[3]})"
    assert perm_after & XFEATURE_XTILEDATA, f"AMX permission lost in the restore ({after[3]})"
