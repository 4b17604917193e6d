"""The status record coldsnap's plugin keeps for each SGLang process (`status_path`), as the
orchestrator reads it: one typed record (`ProcessStatus`) with the release measurement of a
scheduler (`ReleaseReport`) and what a rank did at its last resume (`RankResume`).

The plugin writes the record as it goes (an event at a time, each update adding fields); a
reader parses it whole and strictly (`parse_status`, `read_status`): an unknown field, a missing
one or one of the wrong type raises StatusError naming the field and the record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import deep_iterable, in_, instance_of, optional

from coldsnap._errors import PluginError

from ._plan import STATUS_FORMAT, STATUS_KIND


class StatusError(PluginError, ValueError):
    """A status record that cannot be read, or one that is not what the plugin writes; the
    message names the record and the field."""


_str = optional(instance_of(str))
_int = optional(instance_of(int))
_num = optional(instance_of((int, float)))
_map = optional(instance_of(dict))
_strs = optional(deep_iterable(instance_of(str), instance_of((list, tuple))))


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen(kw_only=True)
class StatusEvent:
    """One event of the plugin in this process, when it happened, and the fields it set."""

    event: str = attrs.field(validator=instance_of(str))
    time: float = attrs.field(validator=instance_of((int, float)))
    fields: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ReleaseReport:
    """A scheduler's measurement of a release (coldsnap.plugin._cuda_release): whether the
    released regions left the device, and the device memory around the release."""

    at: float = attrs.field(validator=instance_of((int, float)))
    tags: tuple[str, ...] = attrs.field(default=(), converter=_tuple, validator=_strs)
    device: str | None = attrs.field(default=None, validator=_str)
    error: str | None = attrs.field(default=None, validator=_str)
    regions: dict[str, dict[str, int]] = attrs.field(factory=dict, validator=instance_of(dict))
    resident: dict[str, int] = attrs.field(factory=dict, validator=instance_of(dict))
    residual_device_bytes: int | None = attrs.field(default=None, validator=_int)
    device_used_before: int | None = attrs.field(default=None, validator=_int)
    device_used_after: int | None = attrs.field(default=None, validator=_int)
    # in use right after SGLang's release, before the caches are emptied: what the release
    # itself freed is device_used_before minus this (the graph region has no tensors to check)
    device_used_released: int | None = attrs.field(default=None, validator=_int)
    device_freed: int | None = attrs.field(default=None, validator=_int)
    reserved_before: int | None = attrs.field(default=None, validator=_int)
    reserved_after: int | None = attrs.field(default=None, validator=_int)
    host_cache: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    device_cache: dict[str, Any] | None = attrs.field(default=None, validator=_map)


@attrs.frozen(kw_only=True)
class RankResume:
    """What one rank did at its last resume of the weights: the kind of source it refilled
    from, the NCCL boundary, what it hydrated or loaded, and how long it took."""

    source: str | None = attrs.field(default=None, validator=_str)
    nccl: Any = None
    hydrated: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    loaded: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    residual: Any = None
    second_phase: Any = None
    reseeded: Any = None
    storages_unchanged: bool | None = attrs.field(
        default=None, validator=optional(instance_of(bool))
    )
    seconds: float | None = attrs.field(default=None, validator=_num)


def _nested(record_type: type[Any]) -> Any:
    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            return _build(record_type, value, record_type.__name__)
        return value

    return convert


def _events(value: Any) -> Any:
    if not isinstance(value, list | tuple):
        return value
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or "event" not in item or "time" not in item:
            raise StatusError(f"field 'events[{i}]': an event names its event and time")
        rest = {k: v for k, v in item.items() if k not in ("event", "time")}
        out.append(_build(StatusEvent, {"event": item["event"], "time": item["time"],
                                        "fields": rest}, f"events[{i}]"))  # fmt: skip
    return tuple(out)


@attrs.frozen(kw_only=True)
class ProcessStatus:
    """The latest state of one SGLang process as its plugin recorded it. Every field but the
    first six is absent (None) until the plugin's work sets it."""

    format: int = attrs.field(validator=in_((STATUS_FORMAT,)))
    kind: str = attrs.field(validator=in_((STATUS_KIND,)))
    process: str = attrs.field(validator=instance_of(str))
    pid: int = attrs.field(validator=instance_of(int))
    role: str = attrs.field(validator=instance_of(str))
    mode: str = attrs.field(validator=instance_of(str))
    events: tuple[StatusEvent, ...] = attrs.field(default=(), converter=_events)
    # what the plugin checked when it installed itself
    contract_digest: str | None = attrs.field(default=None, validator=_str)
    contract_variants: dict[str, str] | None = attrs.field(default=None, validator=_map)
    plugin_digest: str | None = attrs.field(default=None, validator=_str)
    hooks: tuple[str, ...] | None = attrs.field(default=None, converter=_tuple, validator=_strs)
    # a scheduler's place in the engine
    tp_rank: int | None = attrs.field(default=None, validator=_int)
    tp_size: int | None = attrs.field(default=None, validator=_int)
    pp_rank: int | None = attrs.field(default=None, validator=_int)
    dp_rank: int | None = attrs.field(default=None, validator=_int)
    # the model storages, and the last operation (release or resume) and how it ended
    registered: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    startup_hydration: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    operation: str | None = attrs.field(default=None, validator=_str)
    outcome: str | None = attrs.field(default=None, validator=_str)
    error: str | None = attrs.field(default=None, validator=_str)
    released_tags: tuple[str, ...] | None = attrs.field(
        default=None, converter=_tuple, validator=_strs
    )
    freed_by: Any = None
    discarded_bytes: int | None = attrs.field(default=None, validator=_int)
    export: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    nccl: Any = None
    residual: Any = None
    spilled: dict[str, Any] | None = attrs.field(default=None, validator=_map)
    resume: RankResume | None = attrs.field(
        default=None, converter=_nested(RankResume), validator=optional(instance_of(RankResume))
    )
    barrier_waited_s: float | None = attrs.field(default=None, validator=_num)
    cuda_release: ReleaseReport | None = attrs.field(
        default=None,
        converter=_nested(ReleaseReport),
        validator=optional(instance_of(ReleaseReport)),
    )
    # the health gates: SGLang's request gate in a scheduler, the HTTP server's own
    request_gate: str | None = attrs.field(default=None, validator=_str)
    gate_reason: str | None = attrs.field(default=None, validator=_str)
    held_batches: int | None = attrs.field(default=None, validator=_int)
    gate: str | None = attrs.field(default=None, validator=_str)
    reason: str | None = attrs.field(default=None, validator=_str)
    # CUDA graphs
    async_decode_graph: str | dict[str, Any] | None = attrs.field(
        default=None, validator=optional(instance_of((str, dict)))
    )  # "pending" until the deferred decode graphs are captured, then what was captured
    shape_calibration: dict[str, Any] | None = attrs.field(default=None, validator=_map)

    @property
    def last_event(self) -> str | None:
        return self.events[-1].event if self.events else None


STATUS_FIELDS = tuple(a.name for a in attrs.fields(ProcessStatus))


def _build(record_type: type[Any], data: Mapping[str, Any], where: str) -> Any:
    names = {a.name for a in attrs.fields(record_type)}
    unknown = sorted(set(map(str, data)) - names)
    if unknown:
        raise StatusError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    try:
        return record_type(**{str(k): v for k, v in data.items()})
    except StatusError as exc:
        raise StatusError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:  # missing, mistyped, or not the plugin's format
        raise StatusError(f"{where}: {_message(exc)}") from None


def _message(exc: Exception) -> str:
    """attrs' validators raise with (message, attribute, ...); the message names the field."""
    first = exc.args[0] if exc.args else exc
    return str(first)


def parse_status(data: Any, *, where: str = "status record") -> ProcessStatus:
    """The typed record of a status record's JSON object; StatusError naming the field."""
    if not isinstance(data, Mapping):
        raise StatusError(f"{where}: expected an object, got {type(data).__name__}")
    status: ProcessStatus = _build(ProcessStatus, data, where)
    return status


def read_status(path: Path) -> ProcessStatus:
    """The status record at `path`; StatusError when it cannot be read or is malformed
    (FileNotFoundError passes through: a process that wrote none is the caller's to name)."""
    return read_status_as_written(path)[1]


def read_status_as_written(path: Path) -> tuple[dict[str, Any], ProcessStatus]:
    """The status record at `path` as written (the JSON object, for reports that keep it
    whole) and as checked; errors as `read_status`."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise StatusError(f"status record {path} is unreadable: {exc}") from None
    return data, parse_status(data, where=f"status record {path}")


__all__ = [
    "STATUS_FIELDS",
    "ProcessStatus",
    "RankResume",
    "ReleaseReport",
    "StatusError",
    "StatusEvent",
    "parse_status",
    "read_status",
    "read_status_as_written",
]
