"""`coldsnap demo`: a tiny real SGLang server, cold-started, captured (n610, native), restored.

It prints the cold start to first answer, the restore to the first answer that equals the cold
server's token for token, their ratio and the capsule's size, and stops everything it started.
Every component is the registered one (`Machine.for_request`); nothing is simulated.

`cold_start` and `restore_to_first_answer` are shared with bench/bench_e2e.py, so that the demo
and the benchmark time the same things the same way.
"""

from __future__ import annotations

import functools
import os
import shutil
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click
import httpx
from attrs import frozen

from coldsnap._errors import OperationError
from coldsnap.backends import Launched, launch, procs
from coldsnap.machine import (
    REGISTRY,
    CaptureRequest,
    Machine,
    ModelRef,
    Receipt,
    RestoreRequest,
    StepEvent,
)

PROMPT = "The quick brown fox jumps over the lazy dog"
MAX_NEW_TOKENS = 16
_POLL_S = 0.05


@frozen
class FirstAnswer:
    """How long it took from the start of an operation to an answer, and the answer's ids."""

    seconds: float
    tokens: tuple[int, ...]


class DemoError(OperationError):
    """A step of the demo failed; the message says which and where its logs are."""


# -- shared with the benchmark ------------------------------------------------------------------


def ready_host() -> str | None:
    """Why this host cannot drive SGLang and CRIU, or None. (The SGLang adapter readies this
    process itself when it is built: on a host without CUDA, SGLang's CPU platform.)"""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed: run `make demo` (or scripts/setup.sh all) first"
    from coldsnap.backends import Criu

    problem = Criu().problem()
    if problem:
        return f"no usable CRIU: {problem}; run `make demo` (or scripts/setup.sh all) first"
    return None


def first_answer(url: str, *, prompt: str = PROMPT, timeout: float = 60.0) -> tuple[int, ...]:
    """The greedy answer's token ids."""
    body = {
        "text": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS},
    }
    response = httpx.post(f"{url}/generate", json=body, timeout=timeout, verify=_tls())
    response.raise_for_status()
    return tuple(int(t) for t in response.json()["output_ids"])


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every first answer of this process: httpx builds (and loads the CA
    bundle into) a new one per call otherwise, 35-70 ms on the 2-core CPU host, which the
    restore's first answer would pay inside its timing."""
    return httpx.create_ssl_context()


@frozen
class PlainServer:
    """A plain SGLang server started by `start_plain_server`."""

    launched: Launched
    url: str
    log_path: Path

    def stop(self) -> int | None:
        """Kills the server's whole tree at once and reaps its launcher. A plain server is a
        throwaway reference (a cold start, a benchmark's baseline): a graceful drain has
        nothing to save, and SGLang's would only start after its SIGTERM watchdog's next 5 s
        poll."""
        code = None
        if self.launched.poll() is None:  # not reaped: its PIDs are still its own
            code = procs.kill_tree(self.launched.pid)
        launcher_code = self.launched.stop(timeout=60.0)  # reaps `unshare` where there is one
        return launcher_code if code is None else code


def plain_command(model: Path) -> tuple[list[str], dict[str, str], str]:
    """argv, environment and URL of a plain `python -m sglang.launch_server` (coldsnap's
    plugin not loaded) with the arguments and environment the registered SGLang adapter uses
    on this host."""
    from coldsnap.engines.sglang import free_port

    # The adapter's factory reads nothing of the request to pick this host's settings.
    launcher = REGISTRY.get("engine", "sglang").build(None).launcher
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port),
        *launcher.base_args,
    ]  # fmt: skip
    env = {**os.environ, **launcher.base_env, "SGLANG_PLUGINS": "none"}
    return argv, env, f"http://127.0.0.1:{port}"


def start_plain_server(model: Path, log_path: Path) -> PlainServer:
    """Launches a plain SGLang server (`plain_command`) through the launcher the drivers use
    (coldsnap.backends.launch: its own session, output appended to `log_path`); returns once
    it runs. Stop it with `.stop()`."""
    argv, env, url = plain_command(model)
    return PlainServer(launch(argv, log_path=log_path, env=env), url, log_path)


def cold_start(
    model: Path, log_path: Path, *, prompt: str = PROMPT, timeout: float = 300.0
) -> FirstAnswer:
    """A plain server timed from launch to its first answer, then stopped."""
    argv, env, url = plain_command(model)
    started = time.perf_counter()
    server = PlainServer(launch(argv, log_path=log_path, env=env), url, log_path)
    try:
        tokens = _poll_first_answer(server, prompt, started + timeout)
        return FirstAnswer(time.perf_counter() - started, tokens)
    finally:
        server.stop()


def wait_first_answer(server: PlainServer, *, prompt: str = PROMPT, timeout: float = 300.0) -> None:
    """Waits until a server started with `start_plain_server` answers."""
    _poll_first_answer(server, prompt, time.perf_counter() + timeout)


def _poll_first_answer(server: PlainServer, prompt: str, deadline: float) -> tuple[int, ...]:
    """Asks until the server answers. /generate is polled directly: SGLang's /health generates
    a token and then sleeps a whole second before it says 200, which would add up to 1 s."""
    while True:
        code = server.launched.poll()
        if code is not None:
            raise DemoError(f"SGLang exited with code {code} while starting; see {server.log_path}")
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
    machine = Machine.for_request(request, subscribers=list(subscribers))
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
    receipt = Machine.for_request(request).capture(request)
    if not receipt.ok:
        raise DemoError(f"capture {receipt.outcome}: {receipt.error} (see {request.workdir})")
    return receipt


# -- the command --------------------------------------------------------------------------------


def run_demo() -> int:
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
    from coldsnap.tiny_models import build_model

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
    finally:  # the tree at once, then the product's stop: nothing to drain (PlainServer.stop)
        procs.kill_tree(int(receipt.facts["engine_pid"]))
        machine.stop(receipt)

    click.echo("")
    click.echo(f"cold start to first answer   {cold.seconds:7.2f} s")
    click.echo(f"restore to first answer      {answer.seconds:7.2f} s")
    click.echo(f"ratio                        {cold.seconds / answer.seconds:7.1f}x")
    click.echo(f"capsule size                 {_mb(capsule_bytes):>9}")


def _mb(value: Any) -> str:
    return f"{int(value or 0) / 1e6:.1f} MB"
