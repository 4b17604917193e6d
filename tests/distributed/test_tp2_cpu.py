"""The TP2 qualification's whole sequence on CPU: two gloo ranks and their launcher (one tree,
TCPStore inside it) released, dumped by CRIU, restored twice, hydrated, and checked against the
cold run; the barriers name a rank that does not arrive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coldsnap.backends import Criu

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.criu, pytest.mark.slow, pytest.mark.xdist_group("toys")]


@pytest.fixture(scope="module")
def criu() -> Criu:
    criu = Criu()
    problem = criu.problem()
    if problem:
        pytest.skip(problem)
    return criu


def test_tp2_round_trip_on_cpu(criu: Criu, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        sys.executable, str(REPO / "bench/gpu/tp2.py"), "--out", str(out),
        "--workdir", str(tmp_path / "work"), "--device", "cpu", "--preset", "tiny",
        "--restores", "2", "--criu", str(criu.binary),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    result = json.loads((out / "tp2-default-cpu.json").read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert done.returncode == 0, (result.get("error"), failed, done.stdout[-3000:])
    assert result["ok"] and not failed
    names = {c["name"] for c in result["checks"]}
    for i in (0, 1):
        assert f"restore{i}: rank 1 greedy tokens equal the cold run's" in names
        assert f"restore{i}: all-reduce exact on both ranks" in names
    assert "a rank that does not arrive is named" in names
    assert result["capture"]["image_bytes"] > 0
    assert len(result["capture"]["pids"]) == 3  # the launcher and two ranks: one tree
    # on CPU the release wiped the weights: equal tokens mean the pack was hydrated
    assert all(r["resume"][0]["hydrate"]["nbytes"] > 0 for r in result["restores"])
