"""Snapshot drivers: n580 (context-free template) and n610 (process + CUDA capsule). Each owns
its specs and registers itself (entry point group `coldsnap.registrations`)."""

from coldsnap.machine import LaunchCommand, Launcher

from ._facts import DUMP_SECONDS, ENGINE_START, RESTORE_SECONDS

__all__ = ["DUMP_SECONDS", "ENGINE_START", "RESTORE_SECONDS", "LaunchCommand", "Launcher"]
