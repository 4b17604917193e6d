"""The environment the orchestrator hands an engine and the plugin inside it reads: every
COLDSNAP_* variable, as one validated record (`EngineSettings`), written by the launcher with
`to_env()` and read by the plugin with `EngineSettings.from_env()`, strictly (every bad variable
named with what it accepts).

The environment of an SGLang process is fixed when it starts (and frozen into an n610 image), so
per-operation instructions that change between capture and restore are not read from here but
from the files of coldsnap._wire (the resume plan).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from coldsnap._errors import PluginError

from ._plan import CHECKPOINT_SOURCE, FLAG_VALUES, SOURCES, FlagError, parse_flag

MODES = ("off", "capture", "restore")
# What released weights keep, and where (coldsnap.plugin._memory): nothing, a host copy, or a
# native pack under the process artifact root.
LIVE_BACKINGS = ("discard", "cpu", "disk")
STARTUP_SOURCES = SOURCES
# Load formats that read a checkpoint from a local directory (SGLang `LoadFormat` values);
# admission also checks that the installed SGLang knows the one chosen.
RECOVERY_LOAD_FORMATS = ("auto", "safetensors", "pt")
SHAPE_CALIBRATIONS = ("off", "record")
BOOL_VALUES = FLAG_VALUES
# How long a TP rank waits for its peers at a release/resume barrier (coldsnap.plugin._ranks).
DEFAULT_RANK_TIMEOUT_S = 300.0


class SettingsError(PluginError, ValueError):
    """One or more COLDSNAP_* variables are invalid; each line names one and what it accepts."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        self.variables = tuple(name for name, _ in problems)
        super().__init__("\n".join(f"{name}: {message}" for name, message in problems))


@attrs.frozen(kw_only=True)
class EngineSettings:
    """What the plugin does in this process (all fields from COLDSNAP_* variables).

    mode: off (inert: no hooks), capture (an engine launched to be captured), restore (an
        engine constructed from a restored n580 template).
    live_backing: what released weights keep, and where: discard (nothing: CPU pages go back
        to the kernel, CUDA regions to the device; the resume refills them from its source),
        cpu (a host copy: the CPU pages stay, CUDA uses torch_memory_saver's CPU backup), disk
        (a native pack written under process_artifact_root, then discarded).
    process_artifact_root: where the disk backing writes (`<root>/live/<operation>/`).
    artifact_preverified: the one reading of COLDSNAP_ARTIFACT_PREVERIFIED; every hydration the
        plugin runs passes it on (the native provider reads no variable itself).
    recovery_load_format: SGLang's load format for recovery reloads (a plan may name another);
        the checkpoint must hold files of that format (refused before memory changes).
    keep_residual: at a release, keep a host copy of what the model's checkpoint does not hold
        (buffers such as rotary caches, parameters the checkpoint omits) and restore it after
        every refill. Off only to show what the residual restores (a recovery then leaves those
        tensors as the release left them).
    rank_timeout_s: how long a TP rank waits for the others at a release or resume barrier
        before it fails naming those that did not arrive.
    """

    mode: str = "off"
    artifact_dir: Path | None = None
    process_artifact_root: Path | None = None
    live_backing: str = "discard"
    runtime_dir: Path | None = None
    artifact_preverified: bool = False
    export_model_payload: bool = False
    startup_source: str = CHECKPOINT_SOURCE
    recovery_load_format: str = "auto"
    async_cuda_graphs: bool = False
    shape_calibration: str = "off"
    rank_timeout_s: float = DEFAULT_RANK_TIMEOUT_S
    keep_residual: bool = True

    @property
    def active(self) -> bool:
        return self.mode != "off"

    def to_env(self, *, always: Iterable[str] = ()) -> dict[str, str]:
        """The COLDSNAP_* variables that say this record: every field that is not its default
        (an unset variable reads back as the default), and the fields named in `always` even
        at their default (a field without a value as the variable set to nothing), where an
        inherited environment must not decide them; refuses a record `from_env` would refuse,
        naming each variable."""
        unknown = sorted(set(always) - set(_DEFAULTS))
        if unknown:
            raise ValueError(f"to_env(always=...): no such field: {', '.join(unknown)}")
        problems = _cross_checks(self)
        if problems:
            raise SettingsError(problems)
        out: dict[str, str] = {}
        for name, (field, kind, _accepted) in _VARIABLES.items():
            value = getattr(self, field)
            if value == _DEFAULTS[field] and field not in always:
                continue
            if value is None:
                out[name] = ""
            elif kind == "bool":
                out[name] = "1" if value else "0"
            elif kind == "seconds":
                out[name] = repr(float(value))
            else:
                out[name] = str(value)
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineSettings:
        """The record the COLDSNAP_* variables of `environ` (default: this process's) say;
        SettingsError naming each bad variable with the values it accepts."""
        return load_settings(environ)


# variable name -> (field, kind, accepted values or None)
_VARIABLES: dict[str, tuple[str, str, tuple[str, ...] | None]] = {
    "COLDSNAP_MODE": ("mode", "choice", MODES),
    "COLDSNAP_ARTIFACT_DIR": ("artifact_dir", "path", None),
    "COLDSNAP_PROCESS_ARTIFACT_ROOT": ("process_artifact_root", "path", None),
    "COLDSNAP_LIVE_BACKING": ("live_backing", "choice", LIVE_BACKINGS),
    "COLDSNAP_RUNTIME_DIR": ("runtime_dir", "path", None),
    "COLDSNAP_ARTIFACT_PREVERIFIED": ("artifact_preverified", "bool", BOOL_VALUES),
    "COLDSNAP_EXPORT_MODEL_PAYLOAD": ("export_model_payload", "bool", BOOL_VALUES),
    "COLDSNAP_SGLANG_STARTUP_SOURCE": ("startup_source", "choice", STARTUP_SOURCES),
    "COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT": (
        "recovery_load_format",
        "choice",
        RECOVERY_LOAD_FORMATS,
    ),
    "COLDSNAP_ASYNC_CUDA_GRAPHS": ("async_cuda_graphs", "bool", BOOL_VALUES),
    "COLDSNAP_SHAPE_CALIBRATION": ("shape_calibration", "choice", SHAPE_CALIBRATIONS),
    "COLDSNAP_RANK_TIMEOUT_S": ("rank_timeout_s", "seconds", None),
    "COLDSNAP_KEEP_RESIDUAL": ("keep_residual", "bool", BOOL_VALUES),
}
VARIABLES = tuple(_VARIABLES)
_DEFAULTS = {a.name: a.default for a in attrs.fields(EngineSettings)}


def load_settings(environ: Mapping[str, str] | None = None) -> EngineSettings:
    """Parses every COLDSNAP_* variable of the design; raises SettingsError naming each bad one
    with the values it accepts. Other COLDSNAP_* names are not errors (see `unknown_variables`).
    """
    env = os.environ if environ is None else environ
    problems: list[tuple[str, str]] = []
    values: dict[str, object] = {}
    for name, (field, kind, accepted) in _VARIABLES.items():
        raw = env.get(name)
        if raw is None:
            continue
        value = raw.strip()
        if kind == "choice":
            assert accepted is not None
            if value not in accepted:
                problems.append((name, f"{raw!r} is not one of: {', '.join(accepted)}"))
            else:
                values[field] = value
        elif kind == "seconds":
            try:
                seconds = float(value)
            except ValueError:
                seconds = float("nan")
            if not (math.isfinite(seconds) and seconds > 0):
                problems.append((name, f"{raw!r} is not a number of seconds (accepted: > 0)"))
            else:
                values[field] = seconds
        elif kind == "bool":
            try:
                values[field] = parse_flag(raw)
            except FlagError as exc:
                problems.append((name, str(exc)))
        else:
            if not value:
                continue
            path = Path(value)
            if not path.is_absolute():
                problems.append(
                    (name, f"{raw!r} is not an absolute path (accepted: an absolute path)")
                )
            elif path.exists() and not path.is_dir():
                problems.append(
                    (name, f"{raw!r} exists and is not a directory (accepted: a directory path)")
                )
            else:
                values[field] = path
    settings = EngineSettings(**values) if not problems else None  # type: ignore[arg-type]
    if settings is not None:
        problems += _cross_checks(settings)
    if problems:
        raise SettingsError(problems)
    assert settings is not None
    return settings


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """COLDSNAP_* names the plugin does not know: likely misspellings, logged at start-up.
    (The orchestrator's own COLDSNAP_* variables may reach the engine's environment too, so
    they are not refused.)"""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("COLDSNAP_") and k not in _VARIABLES)


def _cross_checks(s: EngineSettings) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if s.active and s.runtime_dir is None:
        problems.append(
            (
                "COLDSNAP_RUNTIME_DIR",
                f"must be set when COLDSNAP_MODE={s.mode} (accepted: an absolute path)",
            )
        )
    if s.export_model_payload and s.artifact_dir is None:
        problems.append(
            (
                "COLDSNAP_ARTIFACT_DIR",
                "must be set when COLDSNAP_EXPORT_MODEL_PAYLOAD is on (accepted: an absolute path)",
            )
        )
    if s.startup_source == "payload" and s.artifact_dir is None:
        problems.append(
            (
                "COLDSNAP_ARTIFACT_DIR",
                "must be set when COLDSNAP_SGLANG_STARTUP_SOURCE=payload "
                "(accepted: an absolute path)",
            )
        )
    if s.startup_source != "checkpoint" and s.mode != "restore":
        problems.append(
            (
                "COLDSNAP_SGLANG_STARTUP_SOURCE",
                f"{s.startup_source!r} applies only with COLDSNAP_MODE=restore "
                f"(accepted here: checkpoint)",
            )
        )
    if s.live_backing == "disk" and s.process_artifact_root is None:
        problems.append(
            (
                "COLDSNAP_PROCESS_ARTIFACT_ROOT",
                "must be set when COLDSNAP_LIVE_BACKING=disk (accepted: an absolute path)",
            )
        )
    return problems


__all__ = [
    "BOOL_VALUES",
    "DEFAULT_RANK_TIMEOUT_S",
    "LIVE_BACKINGS",
    "MODES",
    "RECOVERY_LOAD_FORMATS",
    "SHAPE_CALIBRATIONS",
    "STARTUP_SOURCES",
    "VARIABLES",
    "EngineSettings",
    "SettingsError",
    "load_settings",
    "unknown_variables",
]
