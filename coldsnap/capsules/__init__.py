"""Capsules on the machine's side: the artifact store's steps (seal at capture, unpublish to undo
it, admit at restore) over `coldsnap.artifacts`, and the capture record a capsule carries.

Registered as store `store` through the entry point `coldsnap.registrations`."""

from __future__ import annotations

from typing import Any

from coldsnap.machine import Engine, Registry

from ._record import RECORD_NAME, CaptureRecord, read_record
from ._steps import StoreArtifacts, carried_facts
from ._verified import VerifiedObjects


def build(request: Any, engine: Engine) -> StoreArtifacts:
    return StoreArtifacts(engine)


def register(registry: Registry) -> None:
    """Entry point of `coldsnap.registrations`: store `store`."""
    registry.register_store(
        "store",
        build=build,
        doc="the local content-addressed store at the request's `store` path",
    )


__all__ = [
    "RECORD_NAME",
    "CaptureRecord",
    "StoreArtifacts",
    "VerifiedObjects",
    "build",
    "carried_facts",
    "read_record",
    "register",
]
