"""Issue 16's fault campaign: SIGKILL the orchestrator at each step of a real CPU capture and
restore, then resume the operation in a new process. The end state is published-and-serving (a
capture's capsule is published and its source retired; a restore answers like a cold start and
stops clean) or rolled back with nothing left behind: no process, no listening port, no file in
the workdir but the journal, receipt, lock and logs, no engine runtime dir or template control
dir, no tag.

Every step of n610 and n580 (native provider) on the toy engine (a real process, real CRIU: each
kill is cheap), and one real SGLang capture and restore (n610, native; marked `sglang`).

Orchestrators are forked from a warm zygote (coldsnap, torch and the components imported once),
so a case costs the engine's work and not three interpreter starts. The zygote is a child
subreaper that lets the kernel reap its children: what a killed orchestrator leaves running is
adopted there, never by pytest (where a zombie would hold a PID a restore takes back), and is
found as the zygote's descendants. A case is killed when its journal shows `step_start` of the
step under test; a step the host's guards leave out of the operation (CUDA steps on CPU) is
skipped without running, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil
import pytest
from attrs import define

from coldsnap.artifacts import Store
from coldsnap.machine import JOURNAL_NAME, REGISTRY, read_journal
from coldsnap.machine._convert import unstructure
from coldsnap.machine._journal import LOCK_NAME
from coldsnap.machine._receipt import RECEIPT_NAME
from coldsnap.testing.toy_engine import build_toy_model
from tests.drivers._toy import answers, capture_request, cold_answers, criu_ready, restore_request

pytestmark = [
    pytest.mark.skipif(criu_ready() is not None, reason=str(criu_ready())),
    pytest.mark.criu,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]

PROVIDER = "native"
DRIVERS = ("n610", "n580")
CASES = {
    op: [(d, step.name) for d in DRIVERS for step in REGISTRY.spec(op, d).steps]
    for op in ("capture", "restore")
}
KEPT = {JOURNAL_NAME, RECEIPT_NAME, LOCK_NAME}  # and logs (*.log): the record of what happened
DEADLINE_S = 120.0
SETTLE_S = 2.0  # a tree that was sent SIGKILL last may take a moment to be gone
REPO = Path(__file__).resolve().parents[2]
CONTROL_ROOT = Path("/run/coldsnap/templates")

ZYGOTE = r"""
import json, os, signal, sys, traceback
from pathlib import Path

from coldsnap import Machine
from coldsnap.backends import become_subreaper
from coldsnap.machine import REGISTRY, read_journal
from coldsnap.machine._convert import parse_request
from coldsnap.machine._targets import read_receipt
from coldsnap.testing.toy import register_toy

register_toy(REGISTRY)
if "--sglang" in sys.argv:  # SGLang imported and its contracts digested once, before any fork
    from coldsnap.engines.sglang import build

    build(None).build()


def operate(mode, arg):
    if mode == "resume" or (mode == "stop" and Path(arg).is_dir()):
        machine = Machine.for_request(read_journal(Path(arg) / "journal.jsonl")[0].request)
        if mode == "stop":
            machine.stop(read_receipt(Path(arg)))
            return {"stopped": arg}
        receipt = machine.resume(arg)
    else:
        request = parse_request(json.loads(Path(arg).read_text()))
        machine = Machine.for_request(request)
        if mode == "steps":
            spec = REGISTRY.spec(request.operation, request.driver)
            return {"steps": [s.name for s in spec.selected(request, machine.components)]}
        receipt = getattr(machine, mode)(request)
    return {"outcome": receipt.outcome, "error": receipt.error}


become_subreaper()  # what a killed orchestrator leaves running is adopted here
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # and reaped by the kernel once it ends
for line in sys.stdin:
    mode, arg, out = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(out + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            result = operate(mode, arg)
        except BaseException:
            result = {"crash": traceback.format_exc()}
        Path(out + ".part").write_text(json.dumps(result))
        os.replace(out + ".part", out)
        os._exit(0)
    sys.stdout.write(f"{pid}\n")
    sys.stdout.flush()
"""


@define
class Orchestrator:
    """One forked orchestrator: its PID and the file its result lands in."""

    pid: int
    out: Path

    def running(self) -> bool:
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def result(self, timeout: float = DEADLINE_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.out.exists():
            if not self.running() and not self.out.exists():
                log = Path(f"{self.out}.log")
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise AssertionError(f"orchestrator {self.pid} died without a result:\n{tail}")
            assert time.monotonic() < deadline, f"orchestrator {self.pid} ran past {timeout} s"
            time.sleep(0.01)
        result = json.loads(self.out.read_text())
        assert "crash" not in result, result["crash"]
        return result

    def kill(self) -> None:
        """SIGKILL, then waits until the PID is gone (the zygote's kernel reaping): a killed
        leader shows as a zombie while its other threads still exit and hold its files (the
        workdir's lock among them)."""
        os.kill(self.pid, signal.SIGKILL)
        while psutil.pid_exists(self.pid):
            time.sleep(0.005)


class Zygote:
    """A warm process that forks orchestrators on request (see the module's docstring)."""

    def __init__(self, root: Path, *flags: str) -> None:
        script = root / "zygote.py"
        script.write_text(ZYGOTE)
        self.root = root
        self.count = 0
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
        )

    def start(self, mode: str, arg: Path) -> Orchestrator:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.count += 1
        out = self.root / f"result-{self.count}-{mode}.json"
        self.proc.stdin.write(json.dumps([mode, str(arg), str(out)]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the zygote ended (exit {self.proc.poll()})"
        return Orchestrator(int(line), out)

    def run(self, mode: str, arg: Path) -> dict[str, Any]:
        return self.start(mode, arg).result()

    def request(self, mode: str, request: Any) -> Orchestrator:
        workdir = Path(request.workdir)
        path = workdir.parent / f"{workdir.name}.request.json"
        path.write_text(json.dumps(unstructure(request)))
        return self.start(mode, path)

    def left_running(self) -> list[psutil.Process]:
        """Live descendants: orchestrators' engines, templates, restored trees."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for proc in children:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                continue
        return alive

    def sweep(self) -> None:
        """Kills whatever is left, so that one case's leftovers never reach the next."""
        for proc in self.left_running():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(self.left_running(), timeout=10)

    def close(self) -> None:
        self.sweep()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


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
        _SELECTED[key] = zygote.run("steps", _request_file(request))["steps"]
    return _SELECTED[key]


def _request_file(request: Any) -> Path:
    workdir = Path(request.workdir)
    path = workdir.parent / f"{workdir.name}.request.json"
    path.write_text(json.dumps(unstructure(request)))
    return path


def _started(workdir: Path, step: str) -> bool:
    try:
        lines = (workdir / JOURNAL_NAME).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return False
    return any(
        record.get("event") == "step_start" and record.get("step") == step
        for record in map(_record, lines)
    )


def _record(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _kill_at(zygote: Zygote, request: Any, step: str) -> set[str]:
    """Runs `request` in an orchestrator and SIGKILLs it at `step_start` of `step`. Returns the
    runtime dirs its processes carried then (an n580 template's own is journaled nowhere)."""
    workdir = Path(request.workdir)
    orchestrator = zygote.start(request.operation, _request_file(request))
    deadline = time.monotonic() + DEADLINE_S
    while not _started(workdir, step):
        assert orchestrator.running(), f"{step} never started: {orchestrator.result()}"
        assert time.monotonic() < deadline, f"{step} never started within {DEADLINE_S} s"
        time.sleep(0.005)
    orchestrator.kill()
    return _runtime_dirs(zygote)


def _runtime_dirs(zygote: Zygote) -> set[str]:
    found = set()
    for proc in zygote.left_running():
        try:
            value = proc.environ().get("COLDSNAP_RUNTIME_DIR")
        except psutil.Error:
            continue
        if value:
            found.add(value)
    return found


def _facts(workdir: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for record in read_journal(workdir / JOURNAL_NAME):
        facts.update(record.facts or {})
    return facts


def _listening(url: str | None) -> bool:
    if not url:
        return False
    parsed = urlparse(url)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((parsed.hostname or "127.0.0.1", parsed.port or 80)) == 0


def _describe(proc: psutil.Process) -> str:
    try:
        with proc.oneshot():
            cmd = " ".join(proc.cmdline())[:160]
            return f"{proc.pid} ({proc.status()}, parent {proc.ppid()}) {cmd}"
    except psutil.Error as exc:
        return f"{proc.pid} ({type(exc).__name__})"


def _host_dirs(facts: dict[str, Any], seen: set[str]) -> set[str]:
    """Every engine runtime dir and template control dir the operation may have made."""
    capsule = facts.get("capsule") or {}
    dirs = {facts.get("runtime_dir"), facts.get("control_dir"), capsule.get("runtime_dir"), *seen}
    if capsule.get("template_id"):
        dirs.add(str(CONTROL_ROOT / capsule["template_id"]))
    return {d for d in dirs if d}


def _leftovers(
    zygote: Zygote, workdir: Path, facts: dict[str, Any], seen: set[str], *, files: bool
) -> dict[str, str]:
    """What an operation left behind, by kind."""
    found: dict[str, str] = {}
    live = psutil.wait_procs(zygote.left_running(), timeout=SETTLE_S)[1]
    if live:
        found["process"] = "processes left running: " + "; ".join(map(_describe, live))
    for url in {facts.get("engine_url"), (facts.get("capsule") or {}).get("engine_url")}:
        if _listening(url):
            found["port"] = f"{url} still listens"
    if files:
        for p in sorted(workdir.iterdir()):
            if p.name not in KEPT and not p.name.endswith(".log"):
                found[f"workdir:{p.name}"] = f"{p} left in the workdir"
    for where in sorted(_host_dirs(facts, seen)):
        if Path(where).exists():
            found[f"host dir {where}"] = f"{where} left behind"
    return found


def _check_clean(
    zygote: Zygote, workdir: Path, facts: dict[str, Any], seen: set[str], *, files: bool
) -> None:
    """Fails on any leftover."""
    found = _leftovers(zygote, workdir, facts, seen, files=files)
    zygote.sweep()  # never leave anything to the next case
    assert not found, "; ".join(found.values())


@pytest.fixture(scope="module")
def capsules(root: Path, model: Path, zygote: Zygote) -> dict[str, str]:
    """The capsule each driver's restore cases restore (captured once, uninterrupted)."""
    names = {}
    for driver in DRIVERS:
        request = capture_request(root, model, driver, PROVIDER, f"base-{driver}")
        result = zygote.request("capture", request).result()
        assert result["outcome"] == "done", result
        _check_clean(zygote, Path(request.workdir), _facts(Path(request.workdir)), set(),
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
    seen = _kill_at(zygote, request, step)
    result = zygote.run("resume", workdir)
    facts = _facts(workdir)
    store = Store(root / "store")
    if result["outcome"] == "done":
        assert store.tags().get(name) == facts["capsule_digest"], "done but not published"
        store.verify()
    else:
        assert result["outcome"] == "rolled_back", result
        assert name not in store.tags(), f"rolled back, but tag {name} is published"
    _check_clean(zygote, workdir, facts, seen, files=result["outcome"] != "done")


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
    seen = _kill_at(zygote, request, step)
    result = zygote.run("resume", workdir)
    facts = _facts(workdir)
    assert Store(root / "store").tags() == tags_before
    if result["outcome"] == "done":
        try:
            assert answers(facts["engine_url"]) == cold
        finally:
            zygote.run("stop", workdir)
    else:
        assert result["outcome"] == "rolled_back", result
    _check_clean(zygote, workdir, facts, seen, files=result["outcome"] != "done")


# -- real SGLang (n610, native): one capture and two restores, each killed once -------------------


@pytest.fixture(scope="module")
def sglang_zygote(e2e_ready: None, root: Path) -> Iterator[Zygote]:
    base = root / "sglang"
    base.mkdir()
    warm = Zygote(base, "--sglang")
    yield warm
    warm.close()


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("operation", "step", "outcome"),
    [
        ("capture", "retire_source", "done"),  # retried: published, the source retired
        ("restore", "resume_weights", "rolled_back"),  # the restored engine stopped, no trace
        ("restore", "acceptance", "done"),  # retried: serves, answers as captured, stops clean
    ],
)
def test_real_sglang_killed_and_resumed_ends_clean(
    root: Path, sglang_zygote: Zygote, operation: str, step: str, outcome: str
) -> None:
    from coldsnap.tiny_models import build_model

    from .conftest import answers as sglang_answers
    from .conftest import capture_request as sglang_capture
    from .conftest import model_ref
    from .conftest import restore_request as sglang_restore

    base = root / "sglang"
    model = model_ref(build_model(base / "tiny-llama", arch="llama", size="tiny", seed=0).path)
    if operation == "capture":
        request = sglang_capture(base, model, "n610", PROVIDER, "real")
    else:
        if "real" not in Store(base / "store").tags():
            pytest.skip("the real capture case did not publish its capsule")
        request = sglang_restore(base, model, "n610", PROVIDER, "real", f"res-{step}")
    workdir = Path(request.workdir)
    seen = _kill_at(sglang_zygote, request, step)
    result = sglang_zygote.run("resume", workdir)
    assert result["outcome"] == outcome, result
    facts = _facts(workdir)
    if operation == "capture":
        store = Store(base / "store")
        assert store.tags().get("real") == facts["capsule_digest"]
        store.verify()
    elif outcome == "done":
        try:  # acceptance passed: the greedy answer equals the capture's; the rest answers too
            assert all(sglang_answers(facts["engine_url"]))
        finally:
            sglang_zygote.run("stop", workdir)
    _check_clean(sglang_zygote, workdir, facts, seen, files=outcome != "done")


# -- real SGLang: sleep, wake and stop of a restored engine, each killed once and resumed ---------


@pytest.mark.sglang
def test_real_sglang_sleep_wake_and_stop_killed_and_resumed(
    root: Path, sglang_zygote: Zygote
) -> None:
    """Each lifecycle operation is journaled like a restore: killed at a step, `resume` ends
    it. A sleep killed at its release rolls back (the engine serves again, answering as
    before); a wake killed at its weights' resume rolls back to asleep (health closed); a stop
    killed at its one step is retried and leaves nothing behind."""
    from coldsnap.cli._sleep import operations, sleep_state
    from coldsnap.engines import EngineClient
    from coldsnap.engines.sglang import SGLANG_POLICY
    from coldsnap.machine import lifecycle_request
    from coldsnap.tiny_models import build_model

    from .conftest import answers as sglang_answers
    from .conftest import model_ref
    from .conftest import restore_request as sglang_restore

    base = root / "sglang"
    if "real" not in Store(base / "store").tags():
        pytest.skip("the real capture case did not publish its capsule")
    model = model_ref(build_model(base / "tiny-llama", arch="llama", size="tiny", seed=0).path)
    request = sglang_restore(base, model, "n610", PROVIDER, "real", "res-lifecycle")
    assert sglang_zygote.request("restore", request).result()["outcome"] == "done"
    target = Path(request.workdir)
    (target / "ops").mkdir()
    facts = _facts(target)
    url = facts["engine_url"]
    expected = sglang_answers(url)

    def killed_then_resumed(operation: str, step: str) -> str:
        op = lifecycle_request(operation, target)
        _kill_at(sglang_zygote, op, step)
        return str(sglang_zygote.run("resume", Path(op.workdir))["outcome"])

    def healthy() -> bool:
        with EngineClient(url, SGLANG_POLICY) as client:
            return client.health(once=True)

    try:
        assert killed_then_resumed("sleep", "release") == "rolled_back"
        assert sleep_state(operations(target)) == "awake" and healthy()
        assert sglang_answers(url) == expected, "a rolled-back sleep left the engine changed"

        asleep = lifecycle_request("sleep", target)
        assert sglang_zygote.request("sleep", asleep).result()["outcome"] == "done"
        assert killed_then_resumed("wake", "resume_weights") == "rolled_back"
        assert sleep_state(operations(target)) == "asleep" and not healthy()

        woke = lifecycle_request("wake", target)
        assert sglang_zygote.request("wake", woke).result()["outcome"] == "done"
        assert sleep_state(operations(target)) == "awake"
        assert sglang_answers(url) == expected, "after the wake the engine answers otherwise"

        assert killed_then_resumed("stop", "stop_engine") == "done"
    finally:
        if not any(op.operation == "stop" and op.outcome == "done" for op in operations(target)):
            sglang_zygote.run("stop", target)
    assert not (target / "image").exists() and not (target / "payload").exists()
    _check_clean(sglang_zygote, target, facts, set(), files=False)


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
    from coldsnap.drivers._processes import RESTORE_WORK, RUNTIME_ENV, env_is, restored_root

    (tmp_path / RESTORE_WORK).mkdir()
    env = {**os.environ, RUNTIME_ENV: "/run/coldsnap/engines/capsule"}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        (tmp_path / RESTORE_WORK / "restored.pid").write_text(f"{proc.pid}\n")
        assert restored_root(tmp_path, env_is(RUNTIME_ENV, "/run/coldsnap/engines/capsule")) == (
            proc.pid
        )
        # The PID now names another process: never taken for the restored tree.
        assert restored_root(tmp_path, env_is(RUNTIME_ENV, "/run/coldsnap/engines/other")) is None
    finally:
        proc.kill()
        proc.wait(10)
    assert restored_root(tmp_path, env_is(RUNTIME_ENV, "/run/coldsnap/engines/capsule")) is None
