"""The fault campaign: SIGKILL the orchestrator at each step of a real CPU capture and restore,
then resume the operation in a new process. The end state is published-and-serving (a
capture's capsule is published and its source retired; a restore answers like a cold start and
stops clean) or rolled back with nothing left behind: no process, no listening port, no file in
the workdir but the journal, receipt, lock and logs, no engine runtime dir or template control
dir, no tag.

Every step of n610 and n580 (native provider) on the toy engine (a real process, real CRIU: each
kill is cheap; xdist group "toys": no SGLang server). The same with real SGLang:
test_fault_campaign_sglang.py. The machinery (zygote, kills, leftovers): tests/e2e/_faults.py.
A step the host's guards leave out of the operation (CUDA steps on CPU) is skipped without
running, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from coldsnap.artifacts import Store
from coldsnap.machine import REGISTRY
from coldsnap.testing.toy_engine import build_toy_model
from tests.drivers._toy import answers, capture_request, cold_answers, criu_ready, restore_request

from ._faults import Zygote, check_clean, journaled_facts, kill_at, request_file

pytestmark = [
    pytest.mark.skipif(criu_ready() is not None, reason=str(criu_ready())),
    pytest.mark.criu,
    pytest.mark.slow,
    pytest.mark.xdist_group("toys"),
]

PROVIDER = "native"
DRIVERS = ("n610", "n580")
CASES = {
    op: [(d, step.name) for d in DRIVERS for step in REGISTRY.spec(op, d).steps]
    for op in ("capture", "restore")
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults", numbered=True)


@pytest.fixture(scope="module")
def zygote(root: Path) -> Iterator[Zygote]:
    warm = Zygote(root)
    yield warm
    warm.close()


@pytest.fixture(scope="module")
def model(root: Path) -> Path:
    return build_toy_model(root / "model", hidden=256, layers=2)


@pytest.fixture(scope="module")
def cold(model: Path) -> list[list[int]]:
    return cold_answers(model, 18731)


_SELECTED: dict[tuple[str, str], list[str]] = {}


def _selected(zygote: Zygote, request: Any) -> list[str]:
    """The steps the operation runs here (guards evaluated on the real components)."""
    key = (request.operation, request.driver)
    if key not in _SELECTED:
        _SELECTED[key] = zygote.run("steps", request_file(request))["steps"]
    return _SELECTED[key]


@pytest.fixture(scope="module")
def capsules(root: Path, model: Path, zygote: Zygote) -> dict[str, str]:
    """The capsule each driver's restore cases restore (captured once, uninterrupted)."""
    names = {}
    for driver in DRIVERS:
        request = capture_request(root, model, driver, PROVIDER, f"base-{driver}")
        result = zygote.request("capture", request).result()
        assert result["outcome"] == "done", result
        check_clean(zygote, Path(request.workdir), journaled_facts(Path(request.workdir)), set(),
                     files=False)  # fmt: skip
        names[driver] = request.name
    return names


@pytest.mark.parametrize(("driver", "step"), CASES["capture"])
def test_capture_killed_at_each_step_resumes_to_published_or_nothing(
    root: Path, model: Path, zygote: Zygote, driver: str, step: str
) -> None:
    name = f"cap-{driver}-{step}"
    request = capture_request(root, model, driver, PROVIDER, name)
    if step not in _selected(zygote, request):
        pytest.skip(f"{step} does not run on this host (its guard leaves it out)")
    workdir = Path(request.workdir)
    seen = kill_at(zygote, request, step)
    result = zygote.run("resume", workdir)
    facts = journaled_facts(workdir)
    store = Store(root / "store")
    if result["outcome"] == "done":
        assert store.tags().get(name) == facts["capsule_digest"], "done but not published"
        store.verify()
    else:
        assert result["outcome"] == "rolled_back", result
        assert name not in store.tags(), f"rolled back, but tag {name} is published"
    check_clean(zygote, workdir, facts, seen, files=result["outcome"] != "done")


@pytest.mark.parametrize(("driver", "step"), CASES["restore"])
def test_restore_killed_at_each_step_resumes_to_serving_or_nothing(
    root: Path,
    model: Path,
    zygote: Zygote,
    capsules: dict[str, str],
    cold: list[list[int]],
    driver: str,
    step: str,
) -> None:
    request = restore_request(
        root, model, driver, PROVIDER, capsules[driver], f"res-{driver}-{step}"
    )
    if step not in _selected(zygote, request):
        pytest.skip(f"{step} does not run on this host (its guard leaves it out)")
    tags_before = Store(root / "store").tags()
    workdir = Path(request.workdir)
    seen = kill_at(zygote, request, step)
    result = zygote.run("resume", workdir)
    facts = journaled_facts(workdir)
    assert Store(root / "store").tags() == tags_before
    if result["outcome"] == "done":
        try:
            assert answers(facts["engine_url"]) == cold
        finally:
            zygote.run("stop", workdir)
    else:
        assert result["outcome"] == "rolled_back", result
    check_clean(zygote, workdir, facts, seen, files=result["outcome"] != "done")


# -- the kill between a spawn and its journal record, made deterministic ---------------------------


def test_an_engine_whose_pid_was_never_journaled_is_found_by_its_runtime_dir(
    tmp_path: Path,
) -> None:
    """What stop_engine does when the orchestrator died between the spawn and the PID's record:
    the runtime dir (journaled before the spawn) finds the tree's root; the dir is removed."""
    import uuid

    from coldsnap.drivers._processes import (
        HOST_ROOT,
        RUNTIME_ENV,
        discard_host_dirs,
        env_is,
        find_roots,
    )

    runtime_dir = HOST_ROOT / "engines" / f"test-{uuid.uuid4().hex}"
    runtime_dir.mkdir(parents=True)
    env = {**os.environ, RUNTIME_ENV: str(runtime_dir)}
    script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(proc.pid).children()) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert find_roots(env_is(RUNTIME_ENV, str(runtime_dir))) == [proc.pid]
        assert find_roots(env_is(RUNTIME_ENV, str(runtime_dir) + "x")) == []
    finally:
        proc.kill()
        proc.wait(10)
        discard_host_dirs(str(runtime_dir), "/etc", str(tmp_path))
    assert not runtime_dir.exists()
    assert Path("/etc").is_dir() and tmp_path.is_dir()  # only dirs below HOST_ROOT go


def test_a_restored_root_is_found_by_criu_pidfile_only_while_it_is_the_capsules(
    tmp_path: Path,
) -> None:
    from coldsnap.backends import RESTORED_PIDFILE
    from coldsnap.drivers._processes import RESTORE_WORK, RUNTIME_ENV, env_is, restored_root

    (tmp_path / RESTORE_WORK).mkdir()
    env = {**os.environ, RUNTIME_ENV: "/run/coldsnap/engines/capsule"}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        (tmp_path / RESTORE_WORK / RESTORED_PIDFILE).write_text(f"{proc.pid}\n")
        assert restored_root(tmp_path, env_is(RUNTIME_ENV, "/run/coldsnap/engines/capsule")) == (
            proc.pid
        )
        # The PID now names another process: never taken for the restored tree.
        assert restored_root(tmp_path, env_is(RUNTIME_ENV, "/run/coldsnap/engines/other")) is None
    finally:
        proc.kill()
        proc.wait(10)
    assert restored_root(tmp_path, env_is(RUNTIME_ENV, "/run/coldsnap/engines/capsule")) is None
