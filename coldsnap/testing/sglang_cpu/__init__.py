"""CPU support for running a real SGLang in tests and the demo (never on a GPU install).

- `activate()` readies this process; `cpu_env()` the environment of a child: the directory
  `pythonpath/` goes on PYTHONPATH with a `sitecustomize` that declares torchvision's two ops
  before torchvision loads, and an `sgl_kernel` stand-in whose kernels raise if called.
- `start_server()` launches `python -m sglang.launch_server` on CPU and waits for /health;
  `SGLangServer.stop()` sends SIGTERM to the launcher only.
"""

from ._server import (
    CPU_ARGS,
    ServerStartError,
    SGLangServer,
    free_port,
    server_command,
    start_server,
)
from ._support import PYTHONPATH_DIR, GpuInstallError, activate, check_cpu_install, cpu_env

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
