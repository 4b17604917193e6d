"""SGLang's engine options: the knobs a request names in `engine_options` (strings by key),
checked before anything runs, turned into the plugin's EngineSettings and SGLang's own variable,
and written into every engine's environment explicitly, so what the orchestrator's environment
holds never reaches the engine.

Every option is bound into the capsule and compared at admission: the environment of an engine
is frozen into an image that resumes the captured process, and the release at capture decides
what that image holds (the backing, the residual, the graphs in the memory saver).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from coldsnap._errors import RefusedError
from coldsnap._wire import (
    DEFAULT_RANK_TIMEOUT_S,
    FLAG_VALUES,
    LIVE_BACKINGS,
    RECOVERY_LOAD_FORMATS,
    EngineSettings,
    FlagError,
    parse_flag,
)
from coldsnap.artifacts import Difference

GRAPH_SAVER_ENV = "SGLANG_MEMORY_SAVER_CUDA_GRAPH"
"""SGLang's own variable: at 1 it captures CUDA graphs inside the memory saver's `cuda_graph`
region, so releasing that tag frees the graphs' memory."""


class EngineOptionsError(RefusedError, ValueError):
    """A request's engine options that SGLang's adapter does not know or cannot take; the
    message names each as `engine_options.<key>`."""


@attrs.frozen(kw_only=True)
class SGLangOptions:
    """The engine options, parsed (defaults where the request names none).

    live_backing: what released weights keep (discard, cpu, disk; EngineSettings says more).
    process_artifact_root: where the disk backing writes (an absolute path; needed with disk).
    keep_residual: keep a host copy of what the checkpoint does not hold across a release.
    recovery_load_format: SGLang's load format for a recovery reload; `auto` (the default)
        reloads the way the engine's own command line loads (its `--load-format`, where it
        names one a reload can read: the launcher decides, `recovery_load_format`).
    rank_timeout_s: how long a TP rank waits for its peers at a release or resume barrier.
    cuda_graphs_in_saver: SGLang captures its CUDA graphs inside the memory saver (CUDA only),
        so a release frees them; the graph steps then run.
    """

    live_backing: str = "discard"
    process_artifact_root: str | None = None
    keep_residual: bool = True
    recovery_load_format: str = "auto"
    rank_timeout_s: float = DEFAULT_RANK_TIMEOUT_S
    cuda_graphs_in_saver: bool = False

    def settings(self, base: EngineSettings) -> EngineSettings:
        """`base` (what the launcher decides per operation) with these options."""
        root = Path(self.process_artifact_root) if self.process_artifact_root else None
        return attrs.evolve(
            base,
            live_backing=self.live_backing,
            process_artifact_root=root,
            keep_residual=self.keep_residual,
            recovery_load_format=self.recovery_load_format,
            rank_timeout_s=self.rank_timeout_s,
        )


SETTINGS_FIELDS = (
    "live_backing",
    "process_artifact_root",
    "keep_residual",
    "recovery_load_format",
    "rank_timeout_s",
)
"""The EngineSettings fields the options set (`SGLangOptions.settings`): an engine's
environment names each even at its default (`EngineSettings.to_env(always=...)`), so that the
orchestrator's own environment, which the engine's process inherits, cannot win.
`cuda_graphs_in_saver` is the adapter's (`build`: the launcher's GRAPH_SAVER_ENV, which every
command writes, and the graph steps)."""


def _choice(accepted: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in accepted:
            raise ValueError(f"{raw!r} is not one of: {', '.join(accepted)}")
        return raw

    return parse


def _flag(raw: str) -> bool:
    if not raw.strip():
        raise ValueError(f"is empty (accepted: {', '.join(FLAG_VALUES)})")
    try:
        return parse_flag(raw)
    except FlagError as exc:
        raise ValueError(str(exc)) from None


def _seconds(raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{raw!r} is not a number of seconds (accepted: > 0)")
    return seconds


def _absolute(raw: str) -> str:
    if not os.path.isabs(raw):
        raise ValueError(f"{raw!r} is not an absolute path")
    if os.path.exists(raw) and not os.path.isdir(raw):
        raise ValueError(f"{raw!r} exists and is not a directory")
    return raw


OPTIONS: dict[str, Callable[[str], Any]] = {
    "live_backing": _choice(LIVE_BACKINGS),
    "process_artifact_root": _absolute,
    "keep_residual": _flag,
    "recovery_load_format": _choice(RECOVERY_LOAD_FORMATS),
    "rank_timeout_s": _seconds,
    "cuda_graphs_in_saver": _flag,
}
"""Each option's key and its parser (a ValueError says what it accepts)."""


def _parse(options: Mapping[str, str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    values: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for key, raw in options.items():
        field = f"engine_options.{key}"
        if key not in OPTIONS:
            problems.append((field, f"is not an option of SGLang (known: {', '.join(OPTIONS)})"))
        elif not isinstance(raw, str):
            problems.append((field, f"must be a string, got {type(raw).__name__}"))
        else:
            try:
                values[key] = OPTIONS[key](raw)
            except ValueError as exc:
                problems.append((field, str(exc)))
    if values.get("live_backing") == "disk" and not values.get("process_artifact_root"):
        problems.append(("engine_options.process_artifact_root", "is needed with live_backing "
                         "disk (where the pack is written)"))  # fmt: skip
    return values, problems


def check_engine_options(options: Mapping[str, str]) -> list[tuple[str, str]]:
    """(`engine_options.<key>`, why) for each option SGLang does not know or cannot take."""
    return _parse(options)[1]


def parse_options(options: Mapping[str, str] | None) -> SGLangOptions:
    """The options a request names (none: every default); EngineOptionsError naming each bad
    one."""
    values, problems = _parse(options or {})
    if problems:
        raise EngineOptionsError("; ".join(f"{field}: {why}" for field, why in problems))
    return SGLangOptions(**values)


def options_differences(
    captured: Mapping[str, str], requested: Mapping[str, str]
) -> list[Difference]:
    """One Difference (`engine_options.<key>`, captured, requested) per option whose value,
    default included, a restore would change."""
    was, now = parse_options(captured), parse_options(requested)
    return [
        Difference(f"engine_options.{key}", getattr(was, key), getattr(now, key))
        for key in OPTIONS
        if getattr(was, key) != getattr(now, key)
    ]


__all__ = [
    "GRAPH_SAVER_ENV",
    "OPTIONS",
    "SETTINGS_FIELDS",
    "EngineOptionsError",
    "SGLangOptions",
    "check_engine_options",
    "options_differences",
    "parse_options",
]
