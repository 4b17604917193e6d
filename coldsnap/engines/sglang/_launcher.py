"""SGLang's command line for the drivers: `python -m sglang.launch_server` with coldsnap's
plugin enabled, and the modules an n580 template imports first.

Each engine gets a runtime directory at a host-level path (not under the operation's workdir)
because its path is frozen into the engine's environment and so into an n610 image: a restore
on another host recreates the same path and writes the resume plan there.
"""

from __future__ import annotations

import socket
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coldsnap.machine import LaunchCommand

RUNTIME_ROOT = Path("/run/coldsnap/engines")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_dir(runtime_dir: Path) -> Path:
    """Where an engine started to export writes its weight payload when it is released."""
    return runtime_dir / "payload"


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
            env["COLDSNAP_ARTIFACT_DIR"] = str(export_dir(runtime_dir))
    else:
        env["COLDSNAP_MODE"] = "restore"
        env["COLDSNAP_SGLANG_STARTUP_PROVIDER"] = provider
        if provider == "native" and payload_dir is not None:
            env["COLDSNAP_ARTIFACT_DIR"] = str(payload_dir)
    return env


class SGLangLauncher:
    """`python -m MODULE --model-path ... --port ...` with a fresh runtime dir and port per engine
    (or the request's port); a native restore starts without loading (`--load-format dummy`)
    and hydrates from the capsule's payload laid out under the workdir.

    `base_args` and `base_env` carry what this host needs (on a CPU host, coldsnap.engines.
    sglang.cpu's arguments and environment); `SGLANG_PLUGINS=coldsnap` is always set. A
    subclass may serve another module that speaks the same endpoints and plugin files (the
    tests' toy engine) by overriding `module` and the preloads."""

    module = "sglang.launch_server"
    # What an n580 template imports before it is dumped: the engine's heavy modules.
    template_preload: tuple[str, ...] = (
        "torch",
        "sglang.launch_server",
        "sglang.srt.entrypoints.http_server",
    )
    # What the template's forkserver imports, so the engine's children start warm.
    forkserver_preload: tuple[str, ...] | None = (
        "torch",
        "sglang.srt.managers.scheduler",
        "sglang.srt.managers.detokenizer_manager",
        # Imports every model module (about a second): do it once, in the template.
        "sglang.srt.models.registry",
    )

    def __init__(
        self, base_args: tuple[str, ...] = (), base_env: Mapping[str, str] | None = None
    ) -> None:
        self.base_args = tuple(base_args)
        self.base_env = {**(base_env or {}), "SGLANG_PLUGINS": "coldsnap"}

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


__all__ = ["RUNTIME_ROOT", "SGLangLauncher", "coldsnap_env", "export_dir", "free_port"]
