"""A pinned checkpoint: the exact files (name, size, sha256) of a model revision, checked before
a single tensor is loaded from them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar

import attrs
from attrs import field, frozen

from coldsnap.artifacts import (
    FileDigest,
    digest_problem,
    exactly,
    file_sha256,
    member_name_problem,
)

from .._errors import CheckpointError

CHECKPOINT_FORMAT = 1
_HOST_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")


def _portable(_: Any, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{attribute.name}: a non-empty string is required, got {value!r}")
    if _HOST_PATH.match(value):
        raise ValueError(f"{attribute.name}: {value!r} is a host path; pin the hub id instead")


@frozen
class CheckpointFile:
    name: str = field()
    size: int = field()
    sha256: str = field()

    @name.validator
    def _check_name(self, _: attrs.Attribute, value: str) -> None:
        if problem := member_name_problem(value):
            raise ValueError(f"name: {problem}")

    @size.validator
    def _check_size(self, _: attrs.Attribute, value: int) -> None:
        if type(value) is not int or value < 0:
            raise ValueError(f"size: a non-negative integer is required, got {value!r}")

    @sha256.validator
    def _check_sha(self, _: attrs.Attribute, value: str) -> None:
        if problem := digest_problem(value):
            raise ValueError(f"sha256: {problem}")


def _files(value: object) -> tuple[CheckpointFile, ...]:
    files = tuple(sorted(value, key=lambda f: f.name))  # type: ignore[union-attr]
    names = [f.name for f in files]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"files: duplicate names {duplicates}")
    return files


@frozen
class PinnedCheckpoint:
    """A Hugging Face checkpoint pinned by model id, revision and the digest of every file."""

    KIND: ClassVar[str] = "coldsnap.recovery.checkpoint"

    model_id: str = field(validator=_portable)
    revision: str = field(validator=_portable)
    files: tuple[CheckpointFile, ...] = field(converter=_files)
    format: int = field(default=CHECKPOINT_FORMAT, validator=exactly(CHECKPOINT_FORMAT))
    kind: str = field(default=KIND, validator=exactly(KIND))

    @classmethod
    def pin(
        cls,
        directory: str | os.PathLike[str],
        *,
        model_id: str,
        revision: str,
        patterns: tuple[str, ...] = ("*.safetensors", "*.json"),
    ) -> PinnedCheckpoint:
        """Pins the files under `directory` that match `patterns` (names relative to it)."""
        base = Path(directory)
        paths = sorted({p for pattern in patterns for p in base.rglob(pattern) if p.is_file()})
        files = [
            CheckpointFile(p.relative_to(base).as_posix(), p.stat().st_size, file_sha256(p))
            for p in paths
        ]
        return cls(model_id=model_id, revision=revision, files=tuple(files))

    @property
    def weight_files(self) -> tuple[CheckpointFile, ...]:
        return tuple(f for f in self.files if f.name.endswith(".safetensors"))

    def file_digests(self) -> tuple[FileDigest, ...]:
        """The files as an identity binds them (`ModelBinding.checkpoint`)."""
        return tuple(FileDigest(f.name, f.sha256) for f in self.files)

    def verify(self, directory: str | os.PathLike[str]) -> None:
        """Every pinned file is present with its size and sha256; CheckpointError otherwise.
        (Symlinks are followed: a Hugging Face cache snapshot is made of them; the digest is
        what is trusted.)"""
        base = Path(directory)
        lines = []
        for f in self.files:
            path = base / f.name
            try:
                size = path.stat().st_size
            except OSError as exc:
                lines.append(f"{f.name}: missing ({exc.strerror})")
                continue
            if size != f.size:
                lines.append(f"{f.name}: size: expected {f.size}, found {size}")
                continue
            found = file_sha256(path)
            if found != f.sha256:
                lines.append(f"{f.name}: sha256: expected {f.sha256}, found {found}")
        if lines:
            raise CheckpointError(
                f"checkpoint {self.model_id}@{self.revision} does not match its pin "
                "(nothing was loaded):",
                lines,
            )
