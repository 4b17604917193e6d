"""Which SGLang is installed here, by value: its version, the digest of the contracts the plugin
checks in it, the plugin's own digest with the contract variants in use, those variants, and
the digest of every source file those digests are read from. What the store binds into
capsules (`SGLangEngine.build()`) and checks on admit (`SGLangEngine.build(recorded)`).

Taking the build imports SGLang (6-10 s on CPU, 20-25 s on the H200): a capture does, since it
runs SGLang anyway. A restore does not: the files a capture's build was read from are hashed
where they are now (tens of files, milliseconds) and the version read from the installed
distribution's metadata; when all are the same, so is everything the build derives from them,
and the recorded build is the installed one. A file that changed, went missing or moved to
another install is refused by name."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from coldsnap.artifacts import Difference, IncompatibleArtifact, sha256_file
from coldsnap.machine import InstalledBuild

from . import cpu

ENGINE = "sglang"
MISSING = "missing"
"""What a recorded source file that is not there now is found as."""


def installed_sglang() -> InstalledBuild:
    """The installed SGLang's build, taken by importing it and checking the plugin's contracts
    (ContractError names every unmet one)."""
    from coldsnap.plugin import contract_files, digest, plugin_files, variants_checked
    from coldsnap.plugin import plugin_digest as plugin_digest_of

    contract = digest()  # the check: plugin_digest() then folds in the variants it found
    plugin_digest = plugin_digest_of()
    files = [*contract_files(), *plugin_files(), *_stand_in_files()]
    return InstalledBuild(
        engine=ENGINE,
        version=importlib.metadata.version("sglang"),
        contract=contract,
        plugin_digest=plugin_digest,
        variants=variants_checked() or {},
        sources=_digests(files),
    )


def recorded_sglang(recorded: InstalledBuild) -> InstalledBuild:
    """`recorded` (a capture's build) when the SGLang installed here is the one it was taken
    from: the same version, and every file it names with the same digest where the import path
    finds it now. Nothing is imported. IncompatibleArtifact otherwise, one Difference per
    changed field or file (`engine.sources[<file>]`, found `missing` where it is gone)."""
    if not recorded.sources:
        raise IncompatibleArtifact(
            [Difference("engine.sources", "the files the build was read from", "none")],
            "the recorded SGLang build names no source files to check the install against",
        )
    wrong: list[Difference] = []
    if recorded.engine != ENGINE:
        wrong.append(Difference("engine.name", recorded.engine, ENGINE))
    version = _version()
    if version != recorded.version:
        wrong.append(Difference("engine.version", recorded.version, version))
    for key, digest in sorted(recorded.sources.items()):
        path = _locate(key)
        found = sha256_file(path) if path is not None and path.is_file() else MISSING
        if found != digest:
            wrong.append(Difference(f"engine.sources[{key}]", digest, found))
    if wrong:
        raise IncompatibleArtifact(
            wrong,
            "the SGLang installed here (with coldsnap's plugin and CPU stand-ins) is not the "
            "build the capsule was captured with (expected: the capture's, found: this host's); "
            "a new capture is needed:\n  " + "\n  ".join(str(d) for d in wrong),
        )
    return recorded


def _version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _stand_in_files() -> list[str]:
    """The CPU stand-ins SGLang imports in place of its kernels, when they are in use here."""
    if str(cpu.PYTHONPATH_DIR) not in sys.path:
        return []
    return [str(cpu.PYTHONPATH_DIR / name) for name in cpu.STAND_INS]


def _digests(files: Iterable[str]) -> dict[str, str]:
    """file key -> digest of each file (`source_key`)."""
    return {source_key(f): sha256_file(f) for f in sorted(set(files))}


def source_key(path: str | os.PathLike[str]) -> str:
    """A source file named as the import path reaches it: relative to the folder that holds its
    top-level module or package (`sglang/srt/managers/scheduler.py`, `coldsnap/plugin/_hooks.py`,
    `sgl_kernel/__init__.py`), so the name is the same on every host and `_locate` finds the
    file again without importing anything. ValueError for a file no top-level name reaches."""
    resolved = Path(path).resolve()
    for root in resolved.parents:
        top = resolved.relative_to(root).parts[0].removesuffix(".py")
        if top.isidentifier() and _root(top) == root:
            return resolved.relative_to(root).as_posix()
    raise ValueError(f"{path}: no module of the import path is read from it")


def _locate(key: str) -> Path | None:
    """Where the import path finds the file `key` names now (None: its top-level module is not
    found)."""
    root = _root(key.split("/")[0].removesuffix(".py"))
    return None if root is None else root / key


def _root(top: str) -> Path | None:
    """The folder holding top-level module or package `top` as the import path finds it (an
    imported one: where it was imported from). `find_spec` of a top-level name runs nothing."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve().parent
    if spec.origin and os.path.isabs(spec.origin):
        return Path(spec.origin).resolve().parent
    return None


__all__ = ["ENGINE", "MISSING", "installed_sglang", "recorded_sglang", "source_key"]
