"""Models named by Hugging Face repo id and revision, found in the local Hugging Face cache only.

A capture never reaches the network: what it snapshots must be what this host already holds,
and a download in the middle of an operation would make its time and outcome depend on the Hub.
So a model given as `org/name` and a revision (a branch, a tag or a commit) is looked up in the
cache ($HF_HUB_CACHE, else huggingface_hub's default) with `local_files_only`; a capsule binds
the id and the snapshot's commit hash (what the branch pointed to at capture), never the local
path, which differs from host to host.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from attrs import frozen

from ._errors import RequestError

# huggingface_hub is imported where a request names a Hub model: importing it costs ~0.3 s,
# which every command that builds a request with a local path would pay otherwise.

_COMMIT = re.compile(r"[0-9a-f]{40}")


@frozen
class CachedSnapshot:
    """One revision of a Hub model as this host's cache holds it."""

    repo_id: str
    commit: str
    path: Path


def hub_cache() -> Path:
    """The cache to look in: $HF_HUB_CACHE as it is now (it may be set after import), else the
    one huggingface_hub was configured with."""
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def find_snapshot(repo_id: str, revision: str, *, prefix: str = "model") -> CachedSnapshot:
    """The cached snapshot of `repo_id` at `revision`, or a RequestError naming the field to
    fix (`prefix`.id, .path or .revision) and how."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
        from huggingface_hub.utils import validate_repo_id
    except ImportError as exc:
        raise RequestError(
            [
                (
                    f"{prefix}.path",
                    f"not given, and finding {repo_id} in the Hugging Face cache needs "
                    f"huggingface_hub ({exc}): install it, or give the checkpoint's directory",
                )
            ]
        ) from None

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise RequestError(
            [(f"{prefix}.id", f"'{repo_id}' is not a Hugging Face repo id (org/name): {exc}")]
        ) from None
    cache = hub_cache()
    fetch = f"`hf download {repo_id} --revision {revision}`"
    # The cache's folder for a model repo: "models", then the id's parts, joined by the
    # separator huggingface_hub names. Spelled here because its own helper lives in
    # file_download, whose import (~0.1 s) a restore of a model the cache lacks need not pay.
    repo = cache / constants.REPO_ID_SEPARATOR.join(["models", *repo_id.split("/")])
    if not repo.is_dir():
        raise RequestError(
            [
                (
                    f"{prefix}.path",
                    f"not given, and {repo_id} is not in the local Hugging Face cache {cache} "
                    f"(coldsnap never downloads): fetch it first with {fetch}, or give the "
                    "checkpoint's directory as model.path",
                )
            ]
        )
    # Only now: snapshot_download's module (the Hub API client) takes 0.2-0.5 s to import, which
    # a restore whose capsule's model is not in the cache (a local checkpoint) need not pay.
    from huggingface_hub import snapshot_download

    try:
        path = Path(
            snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
        ).absolute()  # a request's paths are absolute; $HF_HUB_CACHE may be relative
    except LocalEntryNotFoundError:
        raise RequestError(
            [
                (
                    f"{prefix}.revision",
                    f"'{revision}' of {repo_id} is not in the local Hugging Face cache {cache} "
                    f"(cached: {_cached_revisions(repo)}): fetch it first with {fetch}, or "
                    "name a cached revision",
                )
            ]
        ) from None
    if not _COMMIT.fullmatch(path.name) or not path.is_dir():
        raise RequestError(
            [(f"{prefix}.path", f"{path}: not a snapshot folder of the Hugging Face cache")]
        )
    return CachedSnapshot(repo_id=repo_id, commit=path.name, path=path)


def _cached_revisions(repo: Path) -> str:
    """What the repo's cache folder holds: its refs (branch -> commit) and snapshot commits."""
    refs = sorted(
        f"{p.relative_to(repo / 'refs')} -> {p.read_text().strip()[:12]}"
        for p in (repo / "refs").rglob("*")
        if p.is_file()
    )
    snapshots = sorted(p.name[:12] for p in (repo / "snapshots").glob("*") if p.is_dir())
    listed = [*(f"ref {r}" for r in refs), *(f"commit {s}" for s in snapshots)]
    return ", ".join(listed) or "nothing"


__all__ = ["CachedSnapshot", "find_snapshot", "hub_cache"]
