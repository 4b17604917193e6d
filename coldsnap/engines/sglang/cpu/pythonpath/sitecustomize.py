"""Runs at start-up of every Python process that has this directory on PYTHONPATH.

Only the CPU host support (coldsnap.engines.sglang.cpu) puts it there. It arms the lazy
torchvision op declaration (see _coldsnap_cpu_support) and then runs the sitecustomize it
shadows, if any.
"""

import _coldsnap_cpu_support

_coldsnap_cpu_support.install()


def _chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_chain()
del _chain
