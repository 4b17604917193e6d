"""A real SGLang server on CPU for tests and the demo (never on a GPU install).

- `start_server()` launches `python -m sglang.launch_server` on CPU and waits for /health;
  `release="0.5.17"` serves the overlay `scripts/setup.sh sglang-0517` installs (RELEASES);
- `register_release_engine(registry, "0.5.17")`: engine `sglang-0.5.17` for `Machine`, run from
  a process started with `release_env("0.5.17")`;
  `SGLangServer.stop()` sends SIGTERM to the launcher only.
- The CPU host support itself is the product's (coldsnap.engines.sglang.cpu); it is re-exported
  here for the tests that start servers: `activate()` readies this process, `cpu_env()` the
  environment of a child.
"""

from coldsnap.engines.sglang import free_port
from coldsnap.engines.sglang.cpu import (
    CPU_ARGS,
    PYTHONPATH_DIR,
    GpuInstallError,
    activate,
    check_cpu_install,
    cpu_env,
)

from ._engine import build_release_engine, register_release_engine, release_engine_name
from ._server import (
    DEFAULT_RELEASE,
    RELEASES,
    ReleaseNotInstalled,
    ServerStartError,
    SGLangServer,
    release_env,
    release_overlay,
    server_command,
    start_server,
)

__all__ = [
    "CPU_ARGS",
    "DEFAULT_RELEASE",
    "PYTHONPATH_DIR",
    "RELEASES",
    "GpuInstallError",
    "ReleaseNotInstalled",
    "SGLangServer",
    "ServerStartError",
    "activate",
    "build_release_engine",
    "check_cpu_install",
    "cpu_env",
    "free_port",
    "register_release_engine",
    "release_engine_name",
    "release_env",
    "release_overlay",
    "server_command",
    "start_server",
]
