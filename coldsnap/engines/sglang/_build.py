"""Which SGLang is installed here, by value: its version, the digest of the contracts the plugin
checks in it, the plugin's own digest with the contract variants in use, and those variants.
What the store binds into capsules and checks on admit (`SGLangEngine.build()`).

Taking it imports SGLang (6-10 s on CPU, 21-24 s on the H200) and re-tokenizes its sources for
the contract check (about 0.1 s), and every admit asks: it is taken again only once a file it is
read from may have changed (`_INSTALLED`), and a fresh process finds it in the node's record
(`_PERSISTED`) while nothing changed, without importing SGLang."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

from coldsnap.artifacts import Persisted, SourceMemo
from coldsnap.machine import InstalledBuild

ENGINE = "sglang"


def installed_sglang() -> InstalledBuild:
    """The installed SGLang's build (memoized as the module's docstring says)."""
    build, _recorded = _INSTALLED.fetch()
    return build


def _installed_sglang() -> InstalledBuild:
    from coldsnap.plugin import digest, plugin_digest, variants_checked

    contract = digest()  # the check: plugin_digest() then folds in the variants it found
    return InstalledBuild(
        engine=ENGINE,
        version=importlib.metadata.version("sglang"),
        contract=contract,
        plugin_digest=plugin_digest(),
        variants=variants_checked() or {},
    )


_SELECTING_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE")


def _build_selector() -> dict[str, str]:
    """What the identity depends on besides the stamped files: this interpreter, its import
    path (cpu.activate() puts the CPU stand-ins and an overlay there) and the environment
    variables that can change what SGLang's import loads (every SGLANG_* one, and
    COLDSNAP_SGLANG_OVERLAY)."""
    env = {
        f"env:{k}": v
        for k, v in os.environ.items()
        if k in _SELECTING_VARIABLES or k.startswith(("SGLANG_", "COLDSNAP_SGLANG_"))
    }
    return {"executable": sys.executable, "sys.path": json.dumps(sys.path), **env}


def _sglang_sources() -> list[str]:
    """What the build is read from: the files of SGLang's and the plugin's loaded modules,
    their directories (a module added), and the import path's directories that hold
    distributions (one installed, removed or upgraded)."""
    files = [
        path
        for name, module in list(sys.modules.items())
        if name.split(".")[0] == "sglang" or name.startswith("coldsnap.plugin")
        if (path := getattr(module, "__file__", None))
    ]
    folders = {os.path.dirname(f) for f in files}
    return [*files, *folders, *(p for p in sys.path if _holds_distributions(p))]


def _holds_distributions(folder: str) -> bool:
    try:
        return any(n.endswith((".dist-info", ".egg-info")) for n in os.listdir(folder or "."))
    except OSError:
        return False


_PERSISTED = Persisted("sglang-build", _build_selector, InstalledBuild)
_INSTALLED = SourceMemo(_installed_sglang, _sglang_sources, persist=_PERSISTED)

__all__ = ["installed_sglang"]
