"""Engine command lines for the drivers: SGLang's server, and the toy engine of the tests.

Each capture gets a runtime directory at a host-level path (not under the operation's workdir)
because its path is frozen into the engine's environment and so into an n610 image: a restore
on another host recreates the same path and writes the resume plan there.
"""

from __future__ import annotations

import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from coldsnap.drivers import LaunchCommand

RUNTIME_ROOT = Path("/run/coldsnap/engines")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coldsnap_env(
    request: Any, provider: str, runtime_dir: Path, payload_dir: Path | None
) -> dict[str, str]:
    """The COLDSNAP_* variables of an engine: capture exports the native payload on release;
    an engine constructed at restore (n580) starts from the payload or the checkpoint."""
    env = {"COLDSNAP_RUNTIME_DIR": str(runtime_dir)}
    if request.operation == "capture":
        env["COLDSNAP_MODE"] = "capture"
        if provider == "native":
            env["COLDSNAP_EXPORT_MODEL_PAYLOAD"] = "1"
            env["COLDSNAP_ARTIFACT_DIR"] = str(runtime_dir / "payload")
    else:
        env["COLDSNAP_MODE"] = "restore"
        env["COLDSNAP_SGLANG_STARTUP_PROVIDER"] = provider
        if provider == "native" and payload_dir is not None:
            env["COLDSNAP_ARTIFACT_DIR"] = str(payload_dir)
    return env


class _Launcher:
    """`python -m MODULE --model-path ... --port ...` with a fresh runtime dir and port per engine
    (or the request's port); a native restore starts without loading (`--load-format dummy`)
    and hydrates from the capsule's payload laid out under the workdir."""

    module = ""
    base_args: tuple[str, ...] = ()
    base_env: dict[str, str] = {}  # replaced per instance, never mutated

    def command(self, request: Any, workdir: Path, *, provider: str) -> LaunchCommand:
        runtime_dir = RUNTIME_ROOT / uuid.uuid4().hex
        runtime_dir.mkdir(parents=True, mode=0o700)
        port = getattr(request, "port", None) or free_port()
        restoring = request.operation == "restore"
        argv = [sys.executable, "-m", self.module, "--model-path", request.model.path,
                "--host", "127.0.0.1", "--port", str(port), *self.base_args,
                *request.engine_args]  # fmt: skip
        if restoring and provider == "native":
            argv += ["--load-format", "dummy"]
        payload = workdir / "payload" if restoring else None
        env = {**self.base_env, **coldsnap_env(request, provider, runtime_dir, payload)}
        return LaunchCommand(argv=argv, env=env, url=f"http://127.0.0.1:{port}")


class ToyLauncher(_Launcher):
    """`coldsnap.testing.toy_engine`: a real HTTP engine process that starts in about a second."""

    module = "coldsnap.testing.toy_engine"


class SGLangLauncher(_Launcher):
    """`python -m sglang.launch_server` with the plugin enabled; `base_env` carries host specifics
    (on CPU hosts, what coldsnap.testing.sglang_cpu provides)."""

    module = "sglang.launch_server"

    def __init__(
        self, base_args: tuple[str, ...] = (), base_env: dict[str, str] | None = None
    ) -> None:
        self.base_args = base_args
        self.base_env = {**(base_env or {}), "SGLANG_PLUGINS": "coldsnap"}
