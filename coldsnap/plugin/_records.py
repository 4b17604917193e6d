"""The plugin's side of the files it shares with the orchestrator under COLDSNAP_RUNTIME_DIR:
the status record it keeps per process, and the shape plan. The records both sides read (the
status record's path and kind, the resume plan) are defined in coldsnap._wire.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from coldsnap._atomic import write_json_atomic
from coldsnap._wire import STATUS_FORMAT, STATUS_KIND, status_path

SHAPE_PLAN_FORMAT = 2  # 2: decode and prefill, planned and warmed, outcome, coverage
SHAPE_PLAN_KIND = "coldsnap.sglang.shape-plan"
SHAPE_PLAN_FILE = "shape-plan.json"
_MAX_EVENTS = 64


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
