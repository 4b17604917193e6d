"""The SGLang adapter counts an engine's ranks from their own status records (written here the
way the plugin writes them, with real processes standing in for the ranks), and its launcher
turns the request's `tp` into SGLang's arguments."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap._wire import STATUS_FORMAT, STATUS_KIND, status_path
from coldsnap.engines import EngineError
from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher, TopologyArgsError, cpu_binding
from coldsnap.engines.sglang._ranks import census
from coldsnap.machine import InstalledBuild, WeightSource
from coldsnap.machine import steps as s

FROM_CHECKPOINT = WeightSource(source="checkpoint", checkpoint="/models/m")


@pytest.fixture
def tree() -> Iterator[tuple[int, list[int]]]:
    """A root process with two children (the ranks): (root pid, [child pids])."""
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
        " for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert root.stdout is not None
    kids = [int(p) for p in root.stdout.readline().split()]
    yield root.pid, kids
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    root.kill()
    root.wait()
    for _ in kids:  # the children were reparented; reap what is ours
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break


def write_rank(runtime_dir: Path, rank: int, pid: int, **fields: Any) -> None:
    record = {
        "format": STATUS_FORMAT,
        "kind": STATUS_KIND,
        "process": f"scheduler-tp{rank}",
        "pid": pid,
        "role": "scheduler",
        "mode": "off",
        "tp_rank": rank,
        "tp_size": 2,
        "registered": {"target": {}},
        "outcome": "ok",
        "operation": "op-1",
        "events": [{"event": "resumed", "time": time.time()}],
        **fields,
    }
    path = status_path(runtime_dir, f"scheduler-tp{rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def engine() -> SGLangEngine:
    return SGLangEngine(
        SGLangLauncher(),
        rank_reports=True,
        identity=lambda: InstalledBuild(
            engine="sglang", version="0", contract="x", plugin_digest="x"
        ),
    )


def ctx(runtime_dir: Path, root: int, pids: dict[str, int] | None = None, **req: Any) -> Any:
    capsule = {s.TP_SIZE.name: 2, s.RANK_PIDS.name: pids or {}}
    return SimpleNamespace(
        facts={
            s.RUNTIME_DIR.name: str(runtime_dir),
            s.ENGINE_PID.name: root,
            s.CAPSULE.name: capsule,
            s.WEIGHT_SOURCE.name: FROM_CHECKPOINT.to_fact(),
        },
        request=SimpleNamespace(**req),
        check=lambda: None,
    )


def test_every_rank_ready_passes_the_barrier(tmp_path: Path, tree: tuple[int, list[int]]) -> None:
    root, kids = tree
    for rank, pid in enumerate(kids):
        write_rank(tmp_path, rank, pid)
    made = engine().tp_barrier(ctx(tmp_path, root))
    assert sorted(made[s.TP_RANKS.name]) == ["scheduler-tp0", "scheduler-tp1"]


def test_the_barrier_names_a_failed_a_missing_and_an_ended_rank(
    tmp_path: Path, tree: tuple[int, list[int]]
) -> None:
    root, kids = tree
    write_rank(tmp_path, 0, kids[0], outcome="failed", error="BarrierTimeout: rank 1 ...")
    with pytest.raises(EngineError) as err:
        engine().tp_barrier(ctx(tmp_path, root))
    text = str(err.value)
    assert "rank 0 (scheduler-tp0" in text and "failed at resumed: BarrierTimeout" in text
    assert "rank 1 (scheduler-tp1): no status record" in text
    write_rank(tmp_path, 0, kids[0])
    write_rank(tmp_path, 1, kids[1], operation="op-0")
    with pytest.raises(EngineError, match="the ranks are at different operations"):
        engine().tp_barrier(ctx(tmp_path, root))
    write_rank(tmp_path, 1, kids[1])
    os.kill(kids[1], 9)
    time.sleep(0.2)
    with pytest.raises(EngineError, match=r"rank 1 \(scheduler-tp1, pid \d+\): its process"):
        engine().tp_barrier(ctx(tmp_path, root))


def test_a_pid_outside_the_engines_tree_is_not_a_rank(
    tmp_path: Path, tree: tuple[int, list[int]]
) -> None:
    root, kids = tree
    pids = {"scheduler-tp0": kids[0], "scheduler-tp1": os.getpid()}
    with pytest.raises(EngineError, match=r"rank 1 .* is not in the engine's tree") as err:
        engine().check_ranks(ctx(tmp_path, root, pids))
    assert "rank 0" not in str(err.value)
    engine().check_ranks(ctx(tmp_path, root, {"scheduler-tp0": kids[0], "scheduler-tp1": kids[1]}))
    os.kill(kids[0], 9)
    time.sleep(0.2)
    named = census(tmp_path, 2, root, {"scheduler-tp0": kids[0], "scheduler-tp1": kids[1]})
    assert "rank 0 (scheduler-tp0" in named and "rank 1" not in named


def test_a_release_counts_the_requests_ranks(tmp_path: Path, tree: tuple[int, list[int]]) -> None:
    from coldsnap.engines.sglang._steps import _check_rank_count

    _root, kids = tree
    started = time.time() - 1
    write_rank(tmp_path, 0, kids[0], events=[{"event": "released", "time": time.time()}])
    with pytest.raises(EngineError, match=r"rank 1 \(scheduler-tp1\): no status record"):
        _check_rank_count(tmp_path, 2, started)
    write_rank(tmp_path, 1, kids[1], events=[{"event": "released", "time": started - 60}])
    with pytest.raises(EngineError, match=r"rank 1 .* did not report this release"):
        _check_rank_count(tmp_path, 2, started)
    with pytest.raises(EngineError, match="more ranks than the request's tp 1: scheduler-tp1"):
        _check_rank_count(tmp_path, 1, started)


def test_the_launcher_turns_tp_into_sglangs_arguments(tmp_path: Path) -> None:
    model = SimpleNamespace(path="/models/m")

    def request(tp: int | None, args: tuple[str, ...] = ()) -> Any:
        return SimpleNamespace(operation="capture", model=model, tp=tp, engine_args=args)

    cpu = SGLangLauncher(("--device", "cpu"), cpu=True)
    one = cpu.command(request(1), tmp_path, weights=FROM_CHECKPOINT)
    assert "--tp-size" not in one.argv and "SGLANG_CPU_OMP_THREADS_BIND" not in one.env
    two = cpu.command(request(2), tmp_path, weights=FROM_CHECKPOINT)
    assert two.argv[two.argv.index("--tp-size") + 1] == "2" and "--sleep-on-idle" in two.argv
    assert two.env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    gpu = SGLangLauncher().command(request(2), tmp_path, weights=FROM_CHECKPOINT)
    assert "--tp-size" in gpu.argv and "SGLANG_CPU_OMP_THREADS_BIND" not in gpu.env
    with pytest.raises(TopologyArgsError, match="engine_args: --tp-size is not accepted"):
        cpu.command(request(1, ("--tp-size=2",)), tmp_path, weights=FROM_CHECKPOINT)


def test_cpu_binding_splits_the_cpus_between_ranks() -> None:
    assert cpu_binding(2, [0, 1]) == "0|1"
    assert cpu_binding(2, [3, 2, 1, 0]) == "0,1|2,3"
    assert cpu_binding(3, [0, 1]) == "0|1|0"
    with pytest.raises(TopologyArgsError):
        cpu_binding(2, [])
