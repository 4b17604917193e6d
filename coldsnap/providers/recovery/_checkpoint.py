"""A pinned checkpoint: the exact files (name, size, sha256) of a model revision, checked before
a single tensor is loaded from them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import attrs
from attrs import field, frozen

from coldsnap.artifacts import FileDigest, checkpoint_digests, file_sha256, validate

from .._errors import CheckpointError

CHECKPOINT_FORMAT = 1


def _sized(_: Any, attribute: attrs.Attribute[Any], value: tuple[FileDigest, ...]) -> None:
    """A pin checks each file's size before hashing it, so it must record every size."""
    unsized = [f.name for f in value if f.size is None]
    if unsized:
        raise ValueError(f"{attribute.name}: a pin records each file's size; none for {unsized}")


@frozen
class PinnedCheckpoint:
    """A Hugging Face checkpoint pinned by model id, revision and the digest of every file."""

    KIND: ClassVar[str] = "coldsnap.recovery.checkpoint"

    model_id: str = field(validator=validate.portable)
    revision: str = field(validator=validate.portable)
    files: tuple[FileDigest, ...] = field(
        converter=validate.unique_names("files", sort=True), validator=_sized
    )
    format: int = field(default=CHECKPOINT_FORMAT, validator=validate.exactly(CHECKPOINT_FORMAT))
    kind: str = field(default=KIND, validator=validate.exactly(KIND))

    @classmethod
    def pin(
        cls,
        directory: str | os.PathLike[str],
        *,
        model_id: str,
        revision: str,
        patterns: tuple[str, ...] = ("*.safetensors", "*.json"),
    ) -> PinnedCheckpoint:
        """Pins the files under `directory` that match `patterns` (names relative to it).
        The files are the same FileDigest records an identity binds (`ModelBinding.checkpoint`)."""
        files = checkpoint_digests(directory, patterns)
        return cls(model_id=model_id, revision=revision, files=files)

    @property
    def weight_files(self) -> tuple[FileDigest, ...]:
        return tuple(f for f in self.files if f.name.endswith(".safetensors"))

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
