"""Shared builders for the artifacts tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coldsnap.artifacts import (
    EngineBuild,
    FileDigest,
    Identity,
    ModelBinding,
    Platform,
    SnapshotDriver,
    Topology,
)

SHA = "sha256:" + "ab" * 32


def _make_identity(**changes: object) -> Identity:
    parts: dict[str, object] = {
        "engine": EngineBuild("sglang", "0.5.23", "sha256:" + "11" * 32),
        "plugin_digest": "sha256:" + "22" * 32,
        "model": ModelBinding(
            model_id="org/tiny-llama",
            revision="main",
            checkpoint=(FileDigest("model.safetensors", SHA),),
            dtype="bfloat16",
            quantization="none",
            layout_digest="sha256:" + "33" * 32,
        ),
        "topology": Topology(tp=1, pp=1, rank=0, world_size=1),
        "platform": Platform(),
        "snapshot": SnapshotDriver("n610", "1"),
    }
    parts.update(changes)
    return Identity(**parts)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def make_identity() -> Callable[..., Identity]:
    """Builds a valid identity; keyword arguments replace its top-level parts."""
    return _make_identity
