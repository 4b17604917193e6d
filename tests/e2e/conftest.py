"""Shared by the end-to-end tests: skips where CRIU or SGLang is missing, request builders,
answers to a fixed prompt set, and a scan for processes an operation left behind."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import attrs
import psutil
import pytest

from coldsnap.engines import EngineClient
from coldsnap.engines.sglang import SGLANG_POLICY
from coldsnap.machine import (
    JOURNAL_NAME,
    CaptureRequest,
    Machine,
    ModelRef,
    Receipt,
    Replay,
    RestoreRequest,
    StepEvent,
    read_journal,
)
from tests._support import need

# Greedy answers to these must be equal, token for token, on a cold server and every restore.
PROMPTS = (
    "The quick brown fox jumps over the lazy dog",
    "hello world one two three",
    "snapshots restore weights in memory",
    "a",
)
MAX_NEW_TOKENS = 12
SAMPLED_PROMPT = "seven wizards quietly"


def _pristine_env() -> dict[str, str]:
    """This session's environment without what the SGLang adapter's CPU support
    (`coldsnap.engines.sglang.cpu.activate()`) adds to it, for commands that must run as from a
    fresh shell."""
    from coldsnap.engines.sglang.cpu import PYTHONPATH_DIR

    env = dict(os.environ)
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    parts = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [p for p in parts if p != str(PYTHONPATH_DIR)]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


PRISTINE_ENV = _pristine_env()

MARKER = "COLDSNAP_E2E_TEST_MARKER"
"""Set in the environment of every command a test runs; every process those commands start
inherits it, and CRIU restores a process's environment as it started, so a test finds what it
left running whatever the command lines say."""


def run_cli(
    *args: str, marker: str, env: dict[str, str] | None = None, name: str = MARKER
) -> subprocess.CompletedProcess[str]:
    """`python -m coldsnap.cli ARGS` with the environment this session started with, marked."""
    return subprocess.run(
        [sys.executable, "-m", "coldsnap.cli", *args],
        capture_output=True,
        text=True,
        timeout=540,  # under pytest's own 600 s per test
        env={**PRISTINE_ENV, name: marker, **(env or {})},
    )


def marked_pids(marker: str, name: str = MARKER) -> list[int]:
    """PIDs of the live processes whose environment carries `name`=`marker`."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(name) == marker:
                found.append(proc.info["pid"])
    return found


def _why_not() -> str | None:
    """Why the end-to-end tests cannot run here, or None."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (scripts/setup.sh sglang)"
    if os.geteuid() != 0:
        return "CRIU needs root"
    from coldsnap.backends import Criu

    problem = Criu().problem()
    return f"no usable CRIU >= 4.2: {problem}" if problem else None


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    """Skips without CRIU or SGLang. (Building the SGLang adapter, `Machine.for_request`,
    readies this process for SGLang on a CPU host: the orchestrator imports SGLang for the
    engine's contract digest.)"""
    need("sglang")
    need("criu")


@pytest.fixture(scope="session")
def tiny_llama(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama of seed 0 that the end-to-end modules capture, built once for the session:
    captures and restores read a model directory and never write it."""
    from coldsnap.tiny_models import build_model

    root = tmp_path_factory.mktemp("tiny-llama")
    return build_model(root / "tiny-llama", arch="llama", size="tiny", seed=0).path


@pytest.fixture(scope="session")
def tiny_cold(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, ...]]:
    """What a plain SGLang (no plugin loaded) started from nothing answers to PROMPTS with the
    tiny Llama of seed 0: the reference of every module that captures that model (one cold
    start for the session)."""
    from coldsnap.cli._demo import start_plain_server, wait_first_answer

    root = tmp_path_factory.mktemp("tiny-cold")
    server = start_plain_server(tiny_llama, root / "cold.log")
    try:
        wait_first_answer(server)
        return answers(server.url)
    finally:
        server.stop()


@attrs.frozen
class CliCapsule:
    """The tiny Llama of seed 0 captured once for the session from the command line, as README's
    "Capture your own server" does: `coldsnap capture --name tiny -- python -m
    sglang.launch_server --model-path M --port P` (n610, native). The modules that serve it from
    the command line (restore, sleep, wake, stop, rm and gc; push and pull; replicas) each take
    their own copy of the store (`own_store`), so that what one does to its store (rm, gc, a
    removed store) no other sees, and none depends on which ran first."""

    store: Path
    """The capture's store; read it through `own_store`, never change it."""
    marker: str
    """MARKER's value in the capture's environment: CRIU gives every restored process the
    environment the captured one started with, so it finds what any restore of it left running."""
    user_port: int
    """The --port of the captured command line (a restore given no --port serves there)."""
    launch: tuple[str, ...]
    """The captured command line."""
    done: subprocess.CompletedProcess[str]
    """What `coldsnap capture` printed and returned."""
    left_running: tuple[int, ...]
    """Marked processes alive right after the capture returned (its source must be retired)."""
    receipt: Receipt
    """The capture's receipt. Its workdir is removed once the receipt and the request are read:
    a capsule restores from its store alone (test_sglang_e2e.py checks that on this one)."""
    request: dict[str, object]
    """The capture request the command line made (the first record of its journal)."""

    def own_store(self, folder: Path) -> Path:
        """A copy of the capsule's store at `folder`/store, for one test to use as it likes.

        Every restore of this capsule takes back its image's PIDs. A tree an earlier test
        restored from the command line outlived its `coldsnap restore` and was adopted by this
        process (a subreaper since in-process drivers ran here): once stopped, its processes are
        zombies of ours, holding those PIDs, until reaped. They are reaped here, before this
        test restores anything. (Outside tests that adopter is init, or the embedding
        orchestrator, whose next restore reaps its own zombies: backends.check_pids_free.)"""
        from coldsnap.backends import reap_children

        reap_children()
        copy = folder / "store"
        shutil.copytree(self.store, copy, symlinks=True)
        return copy


@pytest.fixture(scope="session")
def cli_capsule(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliCapsule]:
    """One command-line capture of the tiny Llama for the session (see CliCapsule): one server
    start instead of one per module that serves that capsule (the CLI, registry and replicas
    tests, and test_sglang_e2e.py's n610 native variant)."""
    from coldsnap.machine._targets import read_receipt
    from tests._support import free_port

    root = tmp_path_factory.mktemp("cli-capsule")
    marker, store, user_port = uuid.uuid4().hex, root / "store", free_port()
    workdir = root / "capture"
    launch = ("python", "-m", "sglang.launch_server", "--model-path", str(tiny_llama),
              "--port", str(user_port))  # fmt: skip
    try:
        done = run_cli("capture", "--name", "tiny", "--store", str(store), "--workdir",
                       str(workdir), "--", *launch, marker=marker)  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        left_running = tuple(marked_pids(marker))
        receipt = read_receipt(workdir)
        request = read_journal(workdir / JOURNAL_NAME)[0].request or {}
        shutil.rmtree(workdir)
        yield CliCapsule(store, marker, user_port, launch, done, left_running, receipt, request)
    finally:
        for pid in marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def model_ref(path: Path, model_id: str = "tiny-llama") -> ModelRef:
    return ModelRef(id=model_id, revision="r1", path=str(path))


def capture_request(
    base: Path, model: ModelRef, driver: str, provider: str, name: str, **kw: object
) -> CaptureRequest:
    return CaptureRequest(
        driver=driver,
        provider=provider,
        model=model,
        engine="sglang",
        workdir=str(base / f"cap-{name}"),
        store=str(base / "store"),
        name=name,
        **kw,  # type: ignore[arg-type]
    )


def restore_request(
    base: Path, model: ModelRef, driver: str, provider: str, name: str, workdir: str
) -> RestoreRequest:
    return RestoreRequest(
        driver=driver,
        provider=provider,
        model=model,
        engine="sglang",
        artifact=name,
        workdir=str(base / workdir),
        store=str(base / "store"),
    )


def answers(url: str) -> list[tuple[int, ...]]:
    with EngineClient(url, SGLANG_POLICY) as client:
        return [client.generate(p, max_new_tokens=MAX_NEW_TOKENS).token_ids for p in PROMPTS]


def flushed_answers(url: str) -> list[tuple[int, ...]]:
    """Greedy answers to PROMPTS, the prefix cache flushed before each and after the last, so
    that no answer comes from a cache the other side did not have."""
    with EngineClient(url, SGLANG_POLICY) as client:
        out = []
        for prompt in PROMPTS:
            client.flush_cache_when_idle()
            out.append(client.generate(prompt, max_new_tokens=MAX_NEW_TOKENS).token_ids)
        client.flush_cache_when_idle()
        return out


def ask_when_healthy(workdir: Path, into: list[object]) -> Callable[[StepEvent], None]:
    """A capture's subscriber that makes the capture's own engine the cold start: once that
    engine (started from nothing by the capture's launch command) is healthy, and before the
    capture records its acceptance answer or releases anything, it puts the engine's
    `flushed_answers` (or what failed) in `into`. It runs in the machine's thread, before the
    next step, so a module needs no server start of its own for its reference answers.
    `cold_from` reads what it put there."""

    def on_event(event: StepEvent) -> None:
        if (event.step, event.phase) != ("wait_healthy", "done"):
            return
        try:
            facts = Replay.of(read_journal(workdir / JOURNAL_NAME)).facts
            into.append(flushed_answers(facts["engine_url"]))
        except Exception as exc:  # kept and raised by `cold_from`, not swallowed
            into.append(exc)

    return on_event


def cold_from(into: list[object]) -> list[tuple[int, ...]]:
    """The answers `ask_when_healthy` collected; raises what failed instead."""
    assert len(into) == 1, "the subscriber never saw the capture's engine healthy"
    if isinstance(into[0], Exception):
        raise into[0]
    return into[0]  # type: ignore[return-value]


def sampled(url: str) -> tuple[int, ...]:
    """One request sampled at temperature 1 with no seed: it draws from the engine's RNG."""
    with EngineClient(url, SGLANG_POLICY) as client:
        return client.generate(
            SAMPLED_PROMPT, max_new_tokens=24, greedy=False, sampling={"temperature": 1.0}
        ).token_ids


def stop_at_once(machine: Machine, receipt: Receipt) -> None:
    """Kills a restored engine's tree at once, then stops it through the product
    (`machine.stop`: what the tree left is found and removed as after any stop). For restores
    whose stop is not what the test checks: SGLang's graceful drain only starts at its SIGTERM
    watchdog's next 5 s poll. Each module still stops one restore per capsule gracefully."""
    from coldsnap.backends.procs import kill_tree

    kill_tree(int(receipt.facts["engine_pid"]))
    machine.stop(receipt)


def why(receipt: Receipt) -> str:
    """A failed receipt's error with the tail of the engine's log."""
    text = f"{receipt.outcome}: {receipt.error}"
    log = receipt.facts.get("engine_log") or str(Path(receipt.workdir) / "engine.log")
    with contextlib.suppress(OSError):
        text += "\n--- engine log tail ---\n" + Path(log).read_text(errors="replace")[-3000:]
    return text


def watch(receipt: Receipt) -> tuple[set[str], set[int]]:
    """What identifies an operation's processes: its engines' runtime dirs (in their
    environment, which CRIU restores as it was) and its root pids."""
    facts = receipt.facts
    dirs = {facts["runtime_dir"]} if facts.get("runtime_dir") else set()
    capsule = facts.get("capsule") or {}
    if capsule.get("runtime_dir"):
        dirs.add(capsule["runtime_dir"])
    pids = {facts[k] for k in ("engine_pid", "template_pid") if facts.get(k)}
    return dirs, pids


def leftovers(runtime_dirs: Iterable[str], pids: Iterable[int]) -> list[str]:
    """Live (not zombie) processes that belong to the given engines."""
    dirs, roots = set(runtime_dirs), set(pids)
    found = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        mine = proc.info["pid"] in roots
        if not mine and dirs:
            try:
                mine = proc.environ().get("COLDSNAP_RUNTIME_DIR") in dirs
            except (psutil.Error, OSError):
                continue
        if mine:
            found.append(f"{proc.info['pid']} {proc.info['name']}")
    return found
