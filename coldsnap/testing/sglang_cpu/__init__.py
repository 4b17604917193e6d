"""A real SGLang server on CPU for tests and the demo (never on a GPU install).

- `start_server()` launches `python -m sglang.launch_server` on CPU and waits for /health;
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

from ._server import ServerStartError, SGLangServer, server_command, start_server

__all__ = [
    "CPU_ARGS",
    "PYTHONPATH_DIR",
    "GpuInstallError",
    "SGLangServer",
    "ServerStartError",
    "activate",
    "check_cpu_install",
    "cpu_env",
    "free_port",
    "server_command",
    "start_server",
]
