"""The resume plan the engine adapter writes under the engine's runtime directory and the plugin
reads, the status record's path, the names of SGLang's memory regions, and the one parser of
boolean COLDSNAP_* values."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import instance_of, optional

from coldsnap._atomic import write_json_atomic
from coldsnap._errors import PluginError

# -- memory regions: SGLang's memory-saver tags (the plugin's contracts check SGLang still spells
# them so), all of them in SGLang's order (GPU_MEMORY_ALL_TYPES) --------------------------------
WEIGHTS = "weights"
KV_CACHE = "kv_cache"
CUDA_GRAPH = "cuda_graph"
MEMORY_TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)

# -- the status record of one SGLang process, written by the plugin ------------------------------
STATUS_FORMAT = 1
STATUS_KIND = "coldsnap.sglang.process-status"

# -- the resume plan, written by the engine adapter, read by the plugin --------------------------
PLAN_FORMAT = 2
PLAN_KIND = "coldsnap.sglang.resume-plan"
PLAN_FILE = "resume-plan.json"
PAYLOAD_SOURCE = "payload"
CHECKPOINT_SOURCE = "checkpoint"
SOURCES = (PAYLOAD_SOURCE, CHECKPOINT_SOURCE)
"""What a plan refills the weights from (coldsnap.machine.WeightSource's `source`), never which
provider chose it."""
_NEEDS = {PAYLOAD_SOURCE: ("payload_dir",), CHECKPOINT_SOURCE: ("checkpoint",)}
_PATHS = ("payload_dir", "checkpoint", "draft_checkpoint")


class PlanError(PluginError, ValueError):
    """The resume plan is missing or malformed; the message names the field."""


# -- boolean COLDSNAP_* variables (COLDSNAP_ARTIFACT_PREVERIFIED, ...): the plugin's settings and
# the native provider read them with this one parser -------------------------------------------
FLAG_TRUE = ("1", "true", "yes", "on")
FLAG_FALSE = ("0", "false", "no", "off")
FLAG_VALUES = ("0", "1", "true", "false", "yes", "no", "on", "off")


class FlagError(PluginError, ValueError):
    """A boolean COLDSNAP_* variable holds a value that is neither true nor false."""


def parse_flag(raw: str) -> bool:
    """1/true/yes/on or 0/false/no/off in any case, surrounding spaces ignored; empty is
    false (the variable set to nothing). Anything else raises FlagError."""
    value = raw.strip().lower()
    if value in FLAG_TRUE:
        return True
    if value in FLAG_FALSE or not value:
        return False
    raise FlagError(f"{raw!r} is not a boolean (accepted: {', '.join(FLAG_VALUES)}, or empty)")


def status_path(runtime_dir: Path, process: str) -> Path:
    """Where the plugin keeps the status record of `process` (main, scheduler-tp0, ...)."""
    return runtime_dir / "sglang" / f"{process}.json"


_str = optional(instance_of(str))


@attrs.frozen(kw_only=True)
class ResumePlan:
    """What the plugin does when weights are resumed after a restore.

    payload: hydrate the registered storages from `payload_dir` (the layout export wrote:
        `<payload_dir>/tp<rank>/<role>`). checkpoint: resume the weights region, load
        `checkpoint` (and a draft model from its own `draft_checkpoint`) through SGLang's
        update-from-disk path, then resume kv_cache and cuda_graph in a second phase.
    """

    source: str = attrs.field(validator=instance_of(str))
    payload_dir: str | None = attrs.field(default=None, validator=_str)
    checkpoint: str | None = attrs.field(default=None, validator=_str)
    draft_checkpoint: str | None = attrs.field(default=None, validator=_str)
    load_format: str | None = attrs.field(default=None, validator=_str)
    preverified: bool = attrs.field(default=False, validator=instance_of(bool))
    # One seed for every rank: TP ranks stay in step only while they sample alike.
    seed: int | None = attrs.field(default=None, validator=optional(instance_of(int)))
    format: int = attrs.field(default=PLAN_FORMAT, validator=instance_of(int))
    kind: str = attrs.field(default=PLAN_KIND, validator=instance_of(str))

    def problems(self) -> list[tuple[str, str]]:
        """(field, what is wrong) for every rule that spans fields; empty when the plan is good."""
        out: list[tuple[str, str]] = []
        if self.format != PLAN_FORMAT:
            out.append(("format", f"unsupported {self.format} (known: {PLAN_FORMAT})"))
        if self.kind != PLAN_KIND:
            out.append(("kind", f"expected {PLAN_KIND!r}, got {self.kind!r}"))
        if self.source not in SOURCES:
            out.append(("source", f"{self.source!r} is not one of: {', '.join(SOURCES)}"))
        for name in _NEEDS.get(self.source, ()):
            if not getattr(self, name):
                out.append((name, f"required for a {self.source} source"))
        for name in _PATHS:
            value = getattr(self, name)
            if value and not os.path.isabs(value):
                out.append((name, f"{value!r} is not an absolute path"))
        return out

    def check(self) -> ResumePlan:
        """Returns the plan, or raises PlanError naming every field that is wrong."""
        problems = self.problems()
        if problems:
            raise PlanError("; ".join(f"resume plan field '{f}': {m}" for f, m in problems))
        return self


def plan_from(data: Mapping[str, Any], *, where: str = "resume plan") -> ResumePlan:
    """A checked plan from its fields (a record read back, or the weight source a provider
    made plus the seed); raises PlanError on an unknown, missing or mistyped field."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{where} is malformed: expected an object, got {type(data).__name__}")
    try:
        plan = ResumePlan(**{str(k): v for k, v in data.items()})
    except TypeError as exc:  # unknown or missing field, or a field of the wrong type
        raise PlanError(f"{where} is malformed: {exc}") from None
    return plan.check()


def write_plan(runtime_dir: Path, plan: ResumePlan) -> Path:
    """Writes the plan atomically to `runtime_dir`/PLAN_FILE; a bad plan is refused unwritten."""
    path = runtime_dir / PLAN_FILE
    write_json_atomic(path, attrs.asdict(plan.check()))
    return path


def read_plan(runtime_dir: Path) -> ResumePlan:
    """The plan the orchestrator wrote; PlanError when it is missing or malformed."""
    path = runtime_dir / PLAN_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(
            f"no resume plan at {path}: write one (source payload or checkpoint) before "
            "resuming the weights of a released coldsnap engine"
        ) from None
    except ValueError as exc:
        raise PlanError(f"resume plan {path} is not JSON: {exc}") from None
    return plan_from(data, where=f"resume plan {path}")
