"""Files the plugin shares with the orchestrator under COLDSNAP_RUNTIME_DIR.

The plugin never imports the orchestrator: it writes a status record per process and reads
a resume plan that the orchestrator writes before it asks SGLang to resume the weights.
Every record carries `format` and `kind`; writes are atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import attrs
import cattrs

from coldsnap._atomic import write_json_atomic

STATUS_FORMAT = 1
STATUS_KIND = "coldsnap.sglang.process-status"
PLAN_FORMAT = 1
PLAN_KIND = "coldsnap.sglang.resume-plan"
PLAN_FILE = "resume-plan.json"
SHAPE_PLAN_FORMAT = 1
SHAPE_PLAN_KIND = "coldsnap.sglang.shape-plan"
SHAPE_PLAN_FILE = "shape-plan.json"
PROVIDERS = ("native", "recovery")
_MAX_EVENTS = 64

_converter = cattrs.Converter(forbid_extra_keys=True)


class PlanError(ValueError):
    """The resume plan is missing or malformed; the message names the field."""


def status_path(runtime_dir: Path, process: str) -> Path:
    return runtime_dir / "sglang" / f"{process}.json"


class StatusFile:
    """The latest state of one SGLang process, with a bounded list of its plugin events."""

    def __init__(self, runtime_dir: Path | None, process: str, base: dict[str, Any]) -> None:
        self.path = None if runtime_dir is None else status_path(runtime_dir, process)
        self.record: dict[str, Any] = {
            "format": STATUS_FORMAT,
            "kind": STATUS_KIND,
            "process": process,
            "pid": os.getpid(),
            "events": [],
            **base,
        }

    def update(self, event: str | None = None, **fields: Any) -> None:
        self.record.update(fields)
        if event is not None:
            events = self.record["events"]
            events.append({"event": event, "time": time.time(), **fields})
            del events[:-_MAX_EVENTS]
        self.record["pid"] = os.getpid()  # a restored n610 tree keeps its PIDs; n580 does not
        if self.path is not None:
            write_json_atomic(self.path, self.record)


@attrs.frozen(kw_only=True)
class ResumePlan:
    """What the plugin does when weights are resumed after a restore.

    native: hydrate the registered storages from `payload_dir` (the layout export wrote:
        `<payload_dir>/tp<rank>/<role>`). recovery: resume the weights region, load
        `checkpoint` (and a draft model from its own `draft_checkpoint`) through SGLang's
        update-from-disk path, then resume kv_cache and cuda_graph in a second phase.
    """

    provider: str
    payload_dir: str | None = None
    checkpoint: str | None = None
    draft_checkpoint: str | None = None
    load_format: str | None = None
    preverified: bool = False
    # One seed for every rank: TP ranks stay in step only while they sample alike.
    seed: int | None = None
    format: int = PLAN_FORMAT
    kind: str = PLAN_KIND

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.format != PLAN_FORMAT:
            out.append(("format", f"unsupported {self.format} (known: {PLAN_FORMAT})"))
        if self.kind != PLAN_KIND:
            out.append(("kind", f"expected {PLAN_KIND!r}, got {self.kind!r}"))
        if self.provider not in PROVIDERS:
            out.append(("provider", f"{self.provider!r} is not one of: {', '.join(PROVIDERS)}"))
        need = {"native": ("payload_dir",), "recovery": ("checkpoint",)}.get(self.provider, ())
        for name in need:
            if not getattr(self, name):
                out.append((name, f"required for provider {self.provider}"))
        for name in ("payload_dir", "checkpoint", "draft_checkpoint"):
            value = getattr(self, name)
            if value and not os.path.isabs(value):
                out.append((name, f"{value!r} is not an absolute path"))
        return out


def write_plan(runtime_dir: Path, plan: ResumePlan) -> Path:
    problems = plan.problems()
    if problems:
        raise PlanError("; ".join(f"resume plan field '{f}': {m}" for f, m in problems))
    path = runtime_dir / PLAN_FILE
    write_json_atomic(path, _converter.unstructure(plan))
    return path


def read_plan(runtime_dir: Path) -> ResumePlan:
    path = runtime_dir / PLAN_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(
            f"no resume plan at {path}: write one (provider native or recovery) before "
            "resuming the weights of a released coldsnap engine"
        ) from None
    except ValueError as exc:
        raise PlanError(f"resume plan {path} is not JSON: {exc}") from None
    try:
        plan = _converter.structure(data, ResumePlan)
    except Exception as exc:  # cattrs reports structure errors as several types
        raise PlanError(f"resume plan {path} is malformed: {exc}") from None
    problems = plan.problems()
    if problems:
        raise PlanError("; ".join(f"resume plan field '{f}': {m}" for f, m in problems))
    return plan
