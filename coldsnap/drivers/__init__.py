"""Snapshot drivers: n580 (context-free template) and n610 (process + CUDA capsule), and the
in-memory doubles (`coldsnap.drivers.memory`) for tests and the dry run."""

from ._launcher import LaunchCommand, Launcher

__all__ = ["LaunchCommand", "Launcher"]
