"""The plugin's settings: the engine environment record of coldsnap._wire (`EngineSettings`),
read once from this process's COLDSNAP_* variables. The orchestrator's launcher writes the same
record (`to_env()`), so both sides agree on every variable, value and cross-check."""

from __future__ import annotations

from coldsnap._wire import (
    BOOL_VALUES,
    DEFAULT_RANK_TIMEOUT_S,
    LIVE_BACKINGS,
    MODES,
    RECOVERY_LOAD_FORMATS,
    SHAPE_CALIBRATIONS,
    STARTUP_SOURCES,
    VARIABLES,
    SettingsError,
    load_settings,
    unknown_variables,
)
from coldsnap._wire import EngineSettings as Settings

__all__ = [
    "BOOL_VALUES",
    "DEFAULT_RANK_TIMEOUT_S",
    "LIVE_BACKINGS",
    "MODES",
    "RECOVERY_LOAD_FORMATS",
    "SHAPE_CALIBRATIONS",
    "STARTUP_SOURCES",
    "VARIABLES",
    "Settings",
    "SettingsError",
    "load_settings",
    "unknown_variables",
]
