"""CPU-only support for SGLang's processes on a host without CUDA (never on a GPU install).

PyPI torchvision is built against CUDA torch: on CPU torch its `_C` extension does not load
and `import torchvision` fails on `torchvision::nms`. Declaring the two op schemas it needs
before it loads lets its pure-Python parts import. The declaration is done lazily, by a
meta-path finder that fires on the first `import torchvision`, so that processes that never
import torchvision (the multiprocessing resource tracker) stay small.
"""

from __future__ import annotations

import importlib.abc
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
# The Library object owns the registrations: dropping it would remove them again.
_library = None


def declare_torchvision_ops() -> bool:
    """Declares torchvision::nms/qnms on a CPU torch build; returns whether it did."""
    global _library
    if _library is not None:
        return True
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return False  # a GPU build: torchvision's own extension provides the ops
    if _has_schema("torchvision::nms"):
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        lib.define(schema)
    _library = lib
    return True


def _has_schema(qualname: str) -> bool:
    import torch

    try:
        torch._C._get_schema(qualname, "")
    except RuntimeError:
        return False
    return True


class _DeclareBeforeTorchvision(importlib.abc.MetaPathFinder):
    """Declares the ops when `torchvision` is first imported, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != "torchvision":
            return None
        uninstall()
        declare_torchvision_ops()
        return None  # let the ordinary finders load torchvision


_finder = _DeclareBeforeTorchvision()


def install() -> None:
    """Arms the finder (idempotent); declares at once if torchvision is already imported."""
    if "torchvision" in sys.modules:
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
