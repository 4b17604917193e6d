"""The fault campaign's machinery (tests/e2e/test_fault_campaign*.py): orchestrators forked
from a warm zygote, killed at the start of a step and resumed, and the scan for what an
operation left behind.

Orchestrators are forked from a warm zygote (coldsnap, torch and the components imported once),
so a case costs the engine's work and not three interpreter starts. The zygote is a child
subreaper that lets the kernel reap its children: what a killed orchestrator leaves running is
adopted there, never by pytest (where a zombie would hold a PID a restore takes back), and is
found as the zygote's descendants. A case is killed when its journal shows `step_start` of the
step under test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil
from attrs import define

from coldsnap.machine import JOURNAL_NAME, read_journal
from coldsnap.machine._convert import unstructure
from coldsnap.machine._journal import LOCK_NAME
from coldsnap.machine._receipt import RECEIPT_NAME

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


def request_file(request: Any) -> Path:
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


def kill_at(zygote: Zygote, request: Any, step: str) -> set[str]:
    """Runs `request` in an orchestrator and SIGKILLs it at `step_start` of `step`. Returns the
    runtime dirs its processes carried then (an n580 template's own is journaled nowhere)."""
    workdir = Path(request.workdir)
    orchestrator = zygote.start(request.operation, request_file(request))
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


def journaled_facts(workdir: Path) -> dict[str, Any]:
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


def check_clean(
    zygote: Zygote, workdir: Path, facts: dict[str, Any], seen: set[str], *, files: bool
) -> None:
    """Fails on any leftover."""
    found = _leftovers(zygote, workdir, facts, seen, files=files)
    zygote.sweep()  # never leave anything to the next case: no process, no host dir
    for where in _host_dirs(facts, seen):
        shutil.rmtree(where, ignore_errors=True)
    assert not found, "; ".join(found.values())
