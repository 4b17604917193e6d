"""Starts and stops a real `python -m sglang.launch_server` on CPU for tests and the demo,
through the snapshot-friendly launcher (coldsnap.backends.launch: own session, log appended)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import attrs
import httpx

from coldsnap._errors import OperationError
from coldsnap.backends import launch
from coldsnap.engines.sglang import free_port
from coldsnap.engines.sglang.cpu import (
    CPU_ARGS,
    OverlayError,
    check_cpu_install,
    check_overlay,
    cpu_env,
)

# The SGLang releases the CPU tests serve: the venv's own, and overlays made by scripts/setup.sh
# (directory under the venv, None for the venv's own).
RELEASES: dict[str, str | None] = {"0.5.23": None, "0.5.17": "sglang-0.5.17"}
DEFAULT_RELEASE = "0.5.23"


class ReleaseNotInstalled(OperationError, LookupError):
    """The SGLang release a test asked for is unknown or its overlay was not installed."""


def release_overlay(release: str) -> Path | None:
    """The overlay directory of `release` (None: the venv's own SGLang); refuses an unknown
    release or an overlay that `scripts/setup.sh sglang-0517` has not installed."""
    if release not in RELEASES:
        raise ReleaseNotInstalled(f"release {release!r}: unknown (known: {', '.join(RELEASES)})")
    name = RELEASES[release]
    if name is None:
        return None
    path = Path(sys.prefix) / name
    try:
        return check_overlay(path)
    except OverlayError as exc:
        raise ReleaseNotInstalled(f"release {release!r}: {exc}") from None


def release_env(release: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CPU environment of an SGLang process that runs `release`."""
    return cpu_env(base, overlay=release_overlay(release))


class ServerStartError(OperationError, RuntimeError):
    """The server exited or did not become healthy; the message holds the log's tail."""


def server_command(
    model_path: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    max_total_tokens: int = 2048,
    mem_fraction_static: float = 0.05,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    return [
        python, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", host,
        "--port", str(port),
        *CPU_ARGS,
        "--max-total-tokens", str(max_total_tokens),
        "--mem-fraction-static", str(mem_fraction_static),
        *extra_args,
    ]  # fmt: skip


@attrs.define
class SGLangServer:
    """A launched server. Stop it with `stop()` (SIGTERM to the launcher only, then wait)."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    command: list[str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Polls /health until 200; raises with the log's tail if the server dies or is slow."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServerStartError(
                        f"SGLang exited with code {self.process.returncode} during start-up; "
                        f"log tail:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/health").status_code == 200:
                        return
                time.sleep(0.25)
        raise ServerStartError(
            f"SGLang not healthy after {timeout:.0f} s; log tail:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the launcher, wait; the process group is killed only as a last resort.

        SIGTERM to the whole group would kill the scheduler first and send the launcher down
        its crash path, so the group is left alone unless the launcher does not exit.
        """
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        self._kill_group_leftovers()
        return self.process.poll()

    def _kill_group_leftovers(self) -> None:
        # The launcher runs in its own session: its pid is the group id.
        pgid = self.process.pid
        deadline = time.monotonic() + 10.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)

    def __enter__(self) -> SGLangServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds for zombies; look for a live member.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def start_server(
    model_path: str | Path,
    *,
    log_path: str | Path,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    max_total_tokens: int = 2048,
    mem_fraction_static: float = 0.05,
    wait: bool = True,
    timeout: float = 180.0,
    release: str = DEFAULT_RELEASE,
) -> SGLangServer:
    """Launches SGLang on CPU with the stand-ins and (by default) waits until /health is 200.

    `release` picks the SGLang that serves (RELEASES: the venv's, or an overlay on PYTHONPATH).
    `env` is added on top of this process's environment. The launcher runs in a new session so
    that leftovers can be found by group; its output is appended to `log_path`.
    """
    check_cpu_install()
    port = free_port() if port is None else port
    cmd = server_command(
        model_path,
        port=port,
        max_total_tokens=max_total_tokens,
        mem_fraction_static=mem_fraction_static,
        extra_args=extra_args,
    )
    full_env = release_env(release)
    full_env.update(env or {})
    log_path = Path(log_path)
    launched = launch(cmd, log_path=log_path, env=full_env)
    server = SGLangServer(
        process=launched.launcher, url=f"http://127.0.0.1:{port}", log_path=log_path, command=cmd
    )
    if wait:
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop()
            raise
    return server
