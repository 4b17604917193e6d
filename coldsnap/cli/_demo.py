"""`coldsnap demo`: a tiny real SGLang server, cold-started, captured (n610, native), restored.

It prints the cold start to first answer, the restore to the first answer that equals the cold
server's token for token, their ratio and the capsule's size, and stops everything it started.
`--dry-run` runs the four specs on the in-memory driver instead and says so.

`cold_start` and `restore_to_first_answer` are shared with bench/bench_e2e.py, so that the demo
and the benchmark time the same things the same way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click
import httpx
from attrs import frozen

from coldsnap.drivers.memory import MemoryWorld, memory_components
from coldsnap.machine import CaptureRequest, Machine, ModelRef, Receipt, RestoreRequest, StepEvent

PROMPT = "The quick brown fox jumps over the lazy dog"
MAX_NEW_TOKENS = 16
_POLL_S = 0.05


@frozen
class FirstAnswer:
    """How long it took from the start of an operation to an answer, and the answer's ids."""

    seconds: float
    tokens: tuple[int, ...]


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its logs are."""


# -- shared with the benchmark ------------------------------------------------------------------


def ready_host() -> str | None:
    """Readies this process to drive SGLang (on a CPU host, the stand-ins of
    coldsnap.testing.sglang_cpu: the orchestrator imports SGLang for the contract digest).
    Returns why the demo cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed: run `make demo` (or scripts/setup.sh all) first"
    from coldsnap.backends import Criu

    problem = Criu().problem()
    if problem:
        return f"no usable CRIU: {problem}; run `make demo` (or scripts/setup.sh all) first"
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        from coldsnap.testing.sglang_cpu import activate

        activate()
    return None


def first_answer(url: str, *, prompt: str = PROMPT, timeout: float = 60.0) -> tuple[int, ...]:
    """The greedy answer's token ids."""
    body = {
        "text": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS},
    }
    response = httpx.post(f"{url}/generate", json=body, timeout=timeout)
    response.raise_for_status()
    return tuple(int(t) for t in response.json()["output_ids"])


def start_plain_server(model: Path, log_path: Path) -> Any:
    """Launches a plain `python -m sglang.launch_server` (coldsnap's plugin not loaded) with the
    engine arguments a capture uses on this host; returns at once. Stop it with `.stop()`."""
    from coldsnap.testing.sglang_cpu import SGLangServer, free_port

    from ._components import sglang_host_settings

    args, host_env = sglang_host_settings()
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port), *args,
    ]  # fmt: skip
    env = {**os.environ, **host_env, "SGLANG_PLUGINS": "none"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return SGLangServer(
        process=process, url=f"http://127.0.0.1:{port}", log_path=log_path, command=argv
    )


def cold_start(
    model: Path, log_path: Path, *, prompt: str = PROMPT, timeout: float = 300.0
) -> FirstAnswer:
    """A plain server timed from launch to its first answer, then stopped."""
    started = time.perf_counter()
    server = start_plain_server(model, log_path)
    try:
        tokens = _poll_first_answer(server, prompt, started + timeout)
        return FirstAnswer(time.perf_counter() - started, tokens)
    finally:
        server.stop()


def wait_first_answer(server: Any, *, prompt: str = PROMPT, timeout: float = 300.0) -> None:
    """Waits until a server started with `start_plain_server` answers."""
    _poll_first_answer(server, prompt, time.perf_counter() + timeout)


def _poll_first_answer(server: Any, prompt: str, deadline: float) -> tuple[int, ...]:
    """Asks until the server answers. /generate is polled directly: SGLang's /health generates
    a token and then sleeps a whole second before it says 200, which would add up to 1 s."""
    while True:
        if server.process.poll() is not None:
            raise DemoError(
                f"SGLang exited with code {server.process.returncode} while starting; "
                f"see {server.log_path}"
            )
        try:
            return first_answer(server.url, prompt=prompt)
        except (httpx.ConnectError, httpx.RemoteProtocolError):
            pass
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 503:
                raise
        if time.perf_counter() > deadline:
            raise DemoError(f"SGLang did not answer in time; see {server.log_path}")
        time.sleep(_POLL_S)


def restore_to_first_answer(
    request: RestoreRequest,
    expected: tuple[int, ...],
    *,
    prompt: str = PROMPT,
    subscribers: Iterable[Callable[[StepEvent], None]] = (),
) -> tuple[FirstAnswer, Receipt, Machine]:
    """Restores with the real components and asks the restored engine the prompt; the time runs
    from the restore's start to that answer. The caller stops the engine (`machine.stop`)."""
    from ._components import real_components

    machine = Machine(**real_components(request), subscribers=list(subscribers))
    started = time.perf_counter()
    receipt = machine.restore(request)
    if not receipt.ok:
        raise DemoError(f"restore {receipt.outcome}: {receipt.error} (see {request.workdir})")
    try:
        tokens = first_answer(receipt.facts["engine_url"], prompt=prompt)
    except BaseException:
        machine.stop(receipt)
        raise
    answer = FirstAnswer(time.perf_counter() - started, tokens)
    if tokens != tuple(expected):
        machine.stop(receipt)
        raise DemoError(
            f"the restored engine answered {list(tokens)}, the cold start {list(expected)}"
        )
    return answer, receipt, machine


def capture(request: CaptureRequest) -> Receipt:
    from ._components import real_components

    receipt = Machine(**real_components(request)).capture(request)
    if not receipt.ok:
        raise DemoError(f"capture {receipt.outcome}: {receipt.error} (see {request.workdir})")
    return receipt


# -- the command --------------------------------------------------------------------------------


def run_demo(*, dry_run: bool) -> int:
    return _dry_run() if dry_run else _real_run()


def _real_run() -> int:
    problem = ready_host()
    if problem:
        click.echo(f"coldsnap demo: {problem}", err=True)
        return 2
    import importlib.metadata

    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="coldsnap-demo-", dir=base))
    click.echo(
        f"coldsnap demo: a tiny random Llama on SGLang {importlib.metadata.version('sglang')}, "
        "captured with driver n610 and provider native"
    )
    click.echo(f"work directory: {root}")
    try:
        _steps(root)
    except Exception as exc:
        click.echo(f"demo FAILED: {exc}", err=True)
        click.echo(f"logs are kept under {root}", err=True)
        return 1
    shutil.rmtree(root, ignore_errors=True)
    return 0


def _steps(root: Path) -> None:
    from coldsnap.testing.models import build_model

    started = time.perf_counter()
    info = build_model(root / "model", arch="llama", size="tiny", seed=0)
    click.echo(
        f"[1/4] built the model ({info.num_parameters / 1e6:.2f} M parameters, "
        f"{info.weight_bytes / 1e6:.2f} MB of bf16 weights) "
        f"in {time.perf_counter() - started:.1f} s"
    )

    cold = cold_start(info.path, root / "cold.log")
    click.echo(f"[2/4] cold start (python -m sglang.launch_server) to first answer: "
               f"{cold.seconds:.2f} s")  # fmt: skip

    model = ModelRef(id="demo-tiny-llama", revision="seed0", path=str(info.path))
    started = time.perf_counter()
    captured = capture(
        CaptureRequest(
            driver="n610",
            provider="native",
            model=model,
            engine="sglang",
            name="demo",
            workdir=str(root / "capture"),
            store=str(root / "store"),
        )
    )
    facts = captured.facts
    capsule_bytes = int(facts.get("capsule_bytes") or 0)
    click.echo(
        f"[3/4] captured in {time.perf_counter() - started:.1f} s: capsule "
        f"{_mb(capsule_bytes)} (process image {_mb(facts.get('image_bytes'))}, "
        f"weights payload {_mb(facts.get('payload_bytes'))})"
    )

    request = RestoreRequest(
        driver="n610",
        provider="native",
        model=model,
        engine="sglang",
        artifact="demo",
        workdir=str(root / "restore"),
        store=str(root / "store"),
    )
    answer, receipt, machine = restore_to_first_answer(request, cold.tokens)
    try:
        steps = ", ".join(f"{s.name} {s.seconds:.2f}" for s in receipt.steps if s.status == "done")
        click.echo(
            f"[4/4] restore to first answer: {answer.seconds:.2f} s, equal to the cold "
            f"start's token for token\n      steps (s): {steps}"
        )
    finally:
        machine.stop(receipt)

    click.echo("")
    click.echo(f"cold start to first answer   {cold.seconds:7.2f} s")
    click.echo(f"restore to first answer      {answer.seconds:7.2f} s")
    click.echo(f"ratio                        {cold.seconds / answer.seconds:7.1f}x")
    click.echo(f"capsule size                 {_mb(capsule_bytes):>9}")


def _mb(value: Any) -> str:
    return f"{int(value or 0) / 1e6:.1f} MB"


# -- the dry run --------------------------------------------------------------------------------


def _dry_run() -> int:
    click.echo(
        "DRY RUN: the in-memory driver stands in for CRIU, CUDA and SGLang; no process is "
        "snapshotted. Times below are the state machines' own overhead."
    )
    world = MemoryWorld()
    with tempfile.TemporaryDirectory(prefix="coldsnap-demo-") as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        model = ModelRef(id="tiny-llama", revision="dry-run", path=str(root / "model"))
        for driver in ("n610", "n580"):
            for provider in ("native", "recovery"):
                machine = Machine(**memory_components(world, driver, provider))
                started = time.perf_counter()
                cap = machine.capture(
                    CaptureRequest(
                        driver=driver,
                        provider=provider,
                        model=model,
                        name=f"{driver}-{provider}",
                        workdir=str(root / f"cap-{driver}-{provider}"),
                        store=str(root / "store"),
                    )
                )
                capture_s = time.perf_counter() - started
                started = time.perf_counter()
                res = machine.restore(
                    RestoreRequest(
                        driver=driver,
                        provider=provider,
                        model=model,
                        artifact=f"{driver}-{provider}",
                        workdir=str(root / f"res-{driver}-{provider}"),
                        store=str(root / "store"),
                    )
                )
                restore_s = time.perf_counter() - started
                click.echo(
                    f"{driver} {provider:<8} capture {cap.outcome} "
                    f"({len(cap.steps)} steps, {capture_s * 1e3:.1f} ms)  "
                    f"restore {res.outcome} ({len(res.steps)} steps, "
                    f"{restore_s * 1e3:.1f} ms)"
                )
                if not (cap.ok and res.ok):
                    return 1
                machine.stop(res)
    click.echo("DRY RUN complete: capture and restore ran every step of all four specs.")
    return 0
