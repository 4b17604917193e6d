"""Which accelerator the installed torch was built for, without importing torch.

Importing torch takes 1.5-2 s on a CPU host (more with CUDA), and a command that only asks
"is this a CPU build?" (`coldsnap restore` on a host without a GPU: whether to ready the CPU
support, what platform to bind) need not pay it. torch's build writes the answer as literals
into its generated `torch/version.py` (`cuda = '12.8'`, `hip = None`), read here as source.
Where torch is imported already, or its version file is not literal assignments, torch itself
is asked: the same answer, the slow way.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

_ACCELERATORS = ("cuda", "hip")


def gpu_build() -> str | None:
    """`cuda <version>` or `hip <version>` for a GPU build of the installed torch, None for a
    CPU build. ModuleNotFoundError without torch."""
    built = _imported() if "torch" in sys.modules else _read() or _imported()
    for name in _ACCELERATORS:
        if built.get(name):
            return f"{name} {built[name]}"
    return None


def _imported() -> dict[str, str | None]:
    import torch

    return {name: getattr(torch.version, name, None) for name in _ACCELERATORS}


def _read() -> dict[str, str | None] | None:
    """The accelerator literals of torch's version file; None where it cannot be read so."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    if not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    found: dict[str, str | None] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id in _ACCELERATORS:
            if not isinstance(value, ast.Constant) or not isinstance(value.value, str | None):
                return None  # not a literal: let torch say
            found[target.id] = value.value
    return found if set(found) == set(_ACCELERATORS) else None


__all__ = ["gpu_build"]
