"""`register()`: the entry point SGLang calls once in each of its processes.

It parses the settings, admits the installed SGLang (contracts), registers the hooks this
process needs with SGLang's HookRegistry, applies them and checks that each one landed.
SGLang only logs exceptions raised by plugins, which would leave a silently half-working
plugin, so every refusal here ends the process with SystemExit and a message that names the
variable or the contract.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from typing import Any

from coldsnap._errors import PluginError
from coldsnap._wire import EngineSettings as Settings
from coldsnap._wire import SettingsError, load_settings, unknown_variables

from . import _auth, _contracts, _cuda_release
from ._gate import HealthGate
from ._records import StatusFile
from ._scheduler import SchedulerHooks

logger = logging.getLogger("coldsnap.plugin")

# Entry functions of SGLang's child processes, found on the stack when register() runs.
_ROLE_BY_ENTRY = {
    "run_scheduler_process": "scheduler",
    "run_detokenizer_process": "detokenizer",
    "run_data_parallel_controller_process": "dp_controller",
}


class HookNotLanded(PluginError, RuntimeError):
    """A hook was registered but SGLang's registry did not apply it."""


class _State:
    settings: Settings | None = None
    role: str | None = None
    digest: str | None = None
    landed: tuple[str, ...] = ()
    scheduler: SchedulerHooks | None = None
    gate: HealthGate | None = None
    status: StatusFile | None = None


STATE = _State()


def process_role() -> str:
    """main (HTTP server / in-process Engine), scheduler, detokenizer or dp_controller."""
    if multiprocessing.parent_process() is None:
        return "main"
    frame: Any = sys._getframe(1)
    while frame is not None:
        role = _ROLE_BY_ENTRY.get(frame.f_code.co_name)
        if role is not None:
            return role
        frame = frame.f_back
    return "other"


def _fail(message: str) -> SystemExit:
    logger.critical(message)
    print(message, file=sys.stderr, flush=True)
    return SystemExit(message)


def register() -> None:
    """The `sglang.srt.plugins` entry point."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        raise _fail(f"coldsnap plugin: invalid settings, refusing to start:\n{exc}") from None
    role = process_role()
    STATE.settings, STATE.role = settings, role
    unknown = unknown_variables()
    if unknown and role == "main":
        logger.warning("coldsnap plugin: ignoring unknown variables %s", ", ".join(unknown))
    if not settings.active or role not in ("main", "scheduler"):
        return
    try:
        STATE.digest = _contracts.admit()
    except _contracts.ContractError as exc:
        raise _fail(str(exc)) from None
    install(settings, role)


def install(settings: Settings, role: str) -> tuple[str, ...]:
    """Registers, applies and verifies the hooks of one process role."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    name, place = _place(role)
    status = StatusFile(
        settings.runtime_dir,
        name,
        {
            **place,
            "role": role,
            "mode": settings.mode,
            "contract_digest": STATE.digest,
            "contract_variants": _contracts.variants_checked(),
            "plugin_digest": _contracts.plugin_digest(),
        },
    )
    STATE.status = status
    if role == "scheduler":
        STATE.scheduler = SchedulerHooks(settings, status)
        targets = STATE.scheduler.targets()
    else:
        STATE.gate = HealthGate(status, settings.runtime_dir)
        targets = STATE.gate.targets()
    targets = [
        *targets,
        *_cuda_release.targets(role, settings, status),
        *_auth.targets(role, settings.runtime_dir),
    ]
    for target, kind, hook in targets:
        HookRegistry.register(target, hook, getattr(HookType, kind))
    # Apply now (idempotent for SGLang's own call after all plugins ran) so that we can check
    # the result before start-up goes on.
    HookRegistry.apply_hooks()
    missing = [t for t, _k, hook in targets if not hook_landed(t, hook)]
    # Guards installed by the plugin itself (contract variants SGLang's registry cannot hook).
    gate = STATE.gate if role != "scheduler" else None
    guards = gate.install_guards() if gate is not None else []
    if gate is not None and not gate.guards_landed():
        missing += guards
    if missing:
        raise _fail(
            "coldsnap plugin: hooks did not land (SGLang logged why): " + ", ".join(missing)
        )
    STATE.landed = tuple(t for t, _k, _h in targets) + tuple(guards)
    status.update("hooks_landed", hooks=list(STATE.landed))
    return STATE.landed


def _place(role: str) -> tuple[str, dict[str, Any]]:
    """The status-record name of this process and, for a scheduler, its place in the engine
    (tp_rank, tp_size, pp_rank, dp_rank), which the orchestrator and the health gate count."""
    if role != "scheduler":
        return role, {}
    # The TP rank is published only after plugins load; the spawn arguments carry it.
    frame: Any = sys._getframe(0)
    while frame is not None and frame.f_code.co_name != "run_scheduler_process":
        frame = frame.f_back
    if frame is None:
        return f"scheduler-pid{os.getpid()}", {}
    loc = frame.f_locals
    name = f"scheduler-tp{loc.get('tp_rank', 0)}"
    if loc.get("pp_rank"):
        name += f"-pp{loc['pp_rank']}"
    if loc.get("dp_rank") is not None:
        name += f"-dp{loc['dp_rank']}"
    place = {
        "tp_rank": loc.get("tp_rank", 0),
        "tp_size": getattr(loc.get("server_args"), "tp_size", None),
        "pp_rank": loc.get("pp_rank") or 0,
        "dp_rank": loc.get("dp_rank"),
    }
    return name, place


def hook_landed(target: str, hook: Any) -> bool:
    """True when the live attribute is a wrapper chain that calls `hook`."""
    import pkgutil

    owner_path, _, attr = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError, ValueError):  # the owner is gone: the hook did not land
        return False
    obj = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    seen = 0
    while obj is not None and seen < 32:
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook or cell.cell_contents == hook:
                    return True
            except ValueError:  # empty cell
                continue
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
    return False


def landed_hooks() -> tuple[str, ...]:
    return STATE.landed
