"""The health gate in the HTTP process: closed while any memory region is released.

`/health`, `/health_generate` and `/ready` all answer from the tokenizer manager's
`server_status`; while it is `Starting` they answer 503. The gate sets `Starting` when a
release passes through and holds it there (refusing SGLang's own attempts to flip it back
to `Up`, e.g. from a health probe) until every released region has been resumed and every
scheduler rank reported a successful resume (hydration included) in its status record. A
failed resume leaves the gate closed and the HTTP call answers with the rank's error.

How SGLang's own flips to `Up` are refused depends on the contract variant in use: AROUND
`TokenizerManager._set_engine_state_field` (variant `state-field`, seen in 0.5.23), or, where
`server_status` is a plain instance attribute (variant `plain-attribute`, seen in 0.5.17), a
property installed on TokenizerManager that keeps the value in the instance and refuses `Up`
while the gate is closed.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

from coldsnap._errors import PluginError
from coldsnap._wire import MEMORY_TAGS

from ._contracts import variant_in_use
from ._records import StatusFile

logger = logging.getLogger("coldsnap.plugin")

SG = "sglang.srt"
ALL_TAGS = MEMORY_TAGS
TM = f"{SG}.managers.tokenizer_manager.TokenizerManager"
STATE_FIELD_CONTRACT = f"{TM}._set_engine_state_field"
STATUS_GUARD_TARGET = f"{TM}.server_status"


class ResumeFailed(PluginError, RuntimeError):
    """A scheduler rank did not complete the resume; the gate stays closed."""


class ReleaseFailed(PluginError, RuntimeError):
    """A scheduler rank did not complete the release."""


def _tags(obj: Any) -> list[str]:
    tags = getattr(obj, "tags", None)
    return list(tags) if tags else list(ALL_TAGS)


class HealthGate:
    def __init__(self, status: StatusFile, runtime_dir: Path | None) -> None:
        self.status = status
        self.runtime_dir = runtime_dir
        self.released: set[str] = set()
        self.closed = False
        self.guard: property | None = None

    def targets(self) -> list[tuple[str, str, Any]]:
        mixin = f"{SG}.managers.tokenizer_control_mixin.TokenizerControlMixin"
        targets = [
            (f"{mixin}.release_memory_occupation", "AROUND", self.around_release),
            (f"{mixin}.resume_memory_occupation", "AROUND", self.around_resume),
        ]
        if variant_in_use(STATE_FIELD_CONTRACT) == "state-field":
            targets.append((STATE_FIELD_CONTRACT, "AROUND", self.around_set_state))
        return targets

    def install_guards(self) -> list[str]:
        """Variant `plain-attribute`: guards `TokenizerManager.server_status` with a property
        (SGLang's hook registry cannot hook an attribute assignment). Returns the targets
        guarded; `guards_landed()` checks they are in place."""
        if variant_in_use(STATE_FIELD_CONTRACT) != "plain-attribute":
            return []
        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        gate = self

        def get_status(tm: Any) -> Any:
            try:
                return tm.__dict__["server_status"]
            except KeyError:
                raise AttributeError("server_status") from None

        def set_status(tm: Any, value: Any) -> None:
            if gate.refuses("server_status", value):
                logger.debug("coldsnap: health gate closed; server_status stays Starting")
                return
            tm.__dict__["server_status"] = value

        self.guard = property(get_status, set_status)
        TokenizerManager.server_status = self.guard
        return [STATUS_GUARD_TARGET]

    def guards_landed(self) -> bool:
        if self.guard is None:
            return True
        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        return TokenizerManager.__dict__.get("server_status") is self.guard

    def refuses(self, name: str, value: Any) -> bool:
        """True for SGLang's own attempt to set the server status `Up` while the gate is
        closed."""
        return (
            self.closed
            and name.lstrip("_") == "server_status"
            and getattr(value, "name", None) == "Up"
        )

    # ----------------------------------------------------------- hooks
    async def around_release(
        self, original: Any, tm: Any, obj: Any, *args: Any, **kwargs: Any
    ) -> Any:
        op = self._stamp(obj)
        self.close(tm, reason="release")
        result = await original(tm, obj, *args, **kwargs)
        failed = self.rank_failures(op, expected_ranks(tm))
        if failed:
            # A rank that refused before releasing changed nothing; if every failing rank
            # refused that early and nothing else is released, serving goes on.
            if not self.released and all(r.get("event") == "release_failed" for r in failed):
                self.open(tm)
            message = _describe(failed)
            self.status.update("release_failed", operation=op, error=message)
            raise ReleaseFailed("coldsnap release did not complete: " + message)
        self.released.update(_tags(obj))
        self.status.update(
            "released", operation=op, released_tags=sorted(self.released), gate="closed"
        )
        return result

    async def around_resume(
        self, original: Any, tm: Any, obj: Any, *args: Any, **kwargs: Any
    ) -> Any:
        op = self._stamp(obj)
        self.close(tm, reason="resume")
        result = await original(tm, obj, *args, **kwargs)
        failed = self.rank_failures(op, expected_ranks(tm))
        if failed:
            message = _describe(failed)
            self.status.update("resume_failed", operation=op, gate="closed", error=message)
            raise ResumeFailed("coldsnap resume did not complete: " + message)
        self.released.difference_update(_tags(obj))
        if not self.released:
            self.open(tm)
        self.status.update(
            "resumed",
            operation=op,
            released_tags=sorted(self.released),
            gate="closed" if self.closed else "open",
        )
        return result

    def around_set_state(
        self, original: Any, tm: Any, name: str, value: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if self.refuses(name, value):
            logger.debug("coldsnap: health gate closed; server_status stays Starting")
            return None
        return original(tm, name, value, *args, **kwargs)

    # ----------------------------------------------------------- gate
    def close(self, tm: Any, *, reason: str) -> None:
        from sglang.srt.managers.tokenizer_manager import ServerStatus

        if not self.closed:
            self.closed = True
            tm.server_status = ServerStatus.Starting
            self.status.update("gate_closed", gate="closed", reason=reason)

    def open(self, tm: Any) -> None:
        from sglang.srt.managers.tokenizer_manager import ServerStatus

        self.closed = False  # first: the status guard lets `Up` through once the gate is open
        tm.server_status = ServerStatus.Up
        self.status.update("gate_opened", gate="open")

    # ----------------------------------------------------------- ranks
    @staticmethod
    def _stamp(obj: Any) -> str:
        """Tags the request so every rank's status record names the operation it answers."""
        if not getattr(obj, "rid", None):
            obj.rid = f"coldsnap-{uuid.uuid4().hex}"
        return str(obj.rid)

    def rank_failures(self, op: str, ranks: list[str]) -> list[dict[str, Any]]:
        """Status records of the scheduler ranks (`ranks`: their process names) that did not
        complete operation `op`: a rank without a record of it is missing, and names itself."""
        if self.runtime_dir is None:
            return []
        failed: list[dict[str, Any]] = []
        directory = self.runtime_dir / "sglang"
        for name in ranks:
            path = directory / f"{name}.json"
            try:
                record = json.loads(path.read_text())
            except FileNotFoundError:
                record = {}
            except (OSError, ValueError) as exc:
                failed.append({"process": name, "outcome": "unreadable", "error": str(exc)})
                continue
            if record.get("operation") != op:
                failed.append(
                    {
                        "process": name,
                        "outcome": "missing",
                        "error": f"no report of operation {op} in {path}",
                    }
                )
                continue
            if record.get("outcome") != "ok":
                last = record.get("events", [{}])[-1] if record.get("events") else {}
                failed.append({**record, "event": last.get("event")})
        return failed


class TopologyUnknown(PluginError, RuntimeError):
    """The HTTP process cannot tell how many scheduler ranks the engine has."""


def expected_ranks(tm: Any) -> list[str]:
    """The status-record names of every scheduler rank of the engine `tm` fronts (the names
    coldsnap.plugin._install gives them): tp x pp ranks, per data-parallel replica."""
    args = getattr(tm, "server_args", None)
    sizes = {k: getattr(args, f"{k}_size", None) for k in ("tp", "pp", "dp")}
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 1}
    if bad:
        raise TopologyUnknown(f"the engine's server_args do not give its ranks: {bad}")
    names = []
    for dp in range(sizes["dp"]):
        for pp in range(sizes["pp"]):
            for tp in range(sizes["tp"]):
                name = f"scheduler-tp{tp}" + (f"-pp{pp}" if pp else "")
                names.append(name + (f"-dp{dp}" if sizes["dp"] > 1 else ""))
    return names


def _describe(failed: list[dict[str, Any]]) -> str:
    return "; ".join(f"{r.get('process')}: {r.get('outcome')}: {r.get('error')}" for r in failed)
