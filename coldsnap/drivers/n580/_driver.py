"""n580: a context-free template (a process snapshotted after its heavy imports, before any CUDA
exists) restored and then released into engine construction with the selected provider."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from coldsnap._atomic import write_json_atomic
from coldsnap._paths import TEMPLATES_ROOT
from coldsnap.backends import Criu, refuse_gpu_mappings
from coldsnap.backends.procs import kill_tree
from coldsnap.machine import (
    ComponentError,
    HostNeed,
    LaunchCommand,
    Launcher,
    StepContext,
    launch_weights,
)

from .._errors import TemplateEnded
from .._host import CRIU_OPERATIONS, criu_needs
from .._processes import (
    RUNTIME_ENV,
    Processes,
    discard_images,
    discard_restore_work,
    discard_unused,
    dump_live,
    engine_stamp,
    env_is,
    find_roots,
    has_arg,
    host_dir_to_make,
    make_host_dir,
    operation_dir,
    restored_root,
    runtime_dirs_of,
    still_ours,
)
from ._template import RELEASE, STATUS

IMAGE_DIR = "template-image"
CONTROL_ROOT = TEMPLATES_ROOT


class N580Driver:
    """Steps of the n580 specs (n580/_specs.py). A template holds no CUDA state, so the driver
    has no capabilities."""

    name = "n580"
    capabilities: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        launcher: Launcher,
        preload: tuple[str, ...],
        forkserver_preload: tuple[str, ...] | None = None,
        template_env: Mapping[str, str] | None = None,
        criu: Criu | None = None,
        control_root: Path = CONTROL_ROOT,
        python: str = sys.executable,
    ) -> None:
        self.launcher = launcher
        self.preload = preload
        self.forkserver_preload = forkserver_preload
        self.template_env = dict(template_env or {})
        self.criu = criu or Criu()
        self.control_root = control_root
        self.python = python
        self.processes = Processes()

    def host_needs(self, request: Any) -> list[HostNeed]:
        """A capture dumps the template with CRIU and a restore restores it, as root
        (checked by the Machine before anything starts); a stop needs nothing of the host."""
        return criu_needs(self.criu) if request.operation in CRIU_OPERATIONS else []

    # -- the template -------------------------------------------------------------------------

    def launch_template(self, ctx: StepContext) -> dict[str, Any]:
        engine = self.launcher.command(ctx.request, ctx.workdir, weights=launch_weights(ctx))
        template_id = uuid.uuid4().hex
        control = self.control_root / template_id
        control.mkdir(parents=True, mode=0o700)
        command = LaunchCommand(
            argv=(
                self.python,
                "-P",  # the working directory is not on its import path (the launcher's reason)
                "-m",
                "coldsnap.drivers.n580._template",
                "--control",
                str(control),
                "--preload",
                ",".join(self.preload),
                *(
                    ("--forkserver-preload", ",".join(self.forkserver_preload))
                    if self.forkserver_preload is not None
                    else ()
                ),
            ),
            env={**engine.env, **self.template_env},
            url=engine.url,
            cwd=engine.cwd,
        )
        # Journaled before the spawn: stop_template finds an unjournaled PID by its control dir.
        ctx.record(
            template_id=template_id,
            control_dir=str(control),
            engine_log=str(ctx.workdir / "engine.log"),
        )
        pid = self.processes.start(command, ctx.workdir / "engine.log")
        ctx.record(template_pid=pid, **engine_stamp(pid))
        status = _wait_status(control, "waiting", pid, ctx, self.processes)
        return {
            "template_pid": pid,
            **engine_stamp(pid),
            "template_id": template_id,
            "control_dir": str(control),
            "import_seconds": status.get("import_seconds"),
            "forkserver_address": status.get("forkserver_address"),
        }

    def stop_template(self, ctx: StepContext) -> None:
        self._stop(ctx, ctx.facts.get("template_pid"))

    def _stop(self, ctx: StepContext, pid: int | None, *, kill: bool = False) -> None:
        """Stops the template or the engine it became (`kill`: the tree is killed at once, no
        drain), then removes its control dir, the runtime dirs (the template's own and the
        engine's) and CRIU's restore work dir. A template whose PID was never journaled (the
        orchestrator died between the spawn or the restore and its record) is found by its
        control dir or by CRIU's pidfile. Replicas of one capsule share the control dir (the
        capsule's template id names it), so a directory is removed only while no live process
        uses it."""
        control = ctx.facts.get("control_dir")
        pid = still_ours(ctx, pid, has_arg(control))
        if pid is None and ctx.request.operation == "restore":
            capsule_id = (ctx.facts.get("capsule") or {}).get("template_id")
            control = control or (str(self.control_root / capsule_id) if capsule_id else None)
            found = restored_root(ctx.workdir, has_arg(control))
            strays = [] if found is None else [found]
        elif ctx.request.operation == "stop":
            strays = []  # the target's receipt named the engine: nothing was left unjournaled
        else:
            strays = [] if pid else find_roots(has_arg(control))
        dirs = set().union(*(runtime_dirs_of(p) for p in [pid, *strays]))
        if kill and pid is not None:
            kill_tree(pid)
        self.processes.stop(pid)
        self.processes.stop_strays(strays)
        discard_unused(control, has_arg(control))
        for runtime_dir in sorted({ctx.facts.get("runtime_dir"), *dirs} - {None}):
            discard_unused(runtime_dir, env_is(RUNTIME_ENV, runtime_dir))
        discard_restore_work(operation_dir(ctx))

    def check_context_free(self, ctx: StepContext) -> None:
        refuse_gpu_mappings(ctx.facts["template_pid"])

    def dump_template(self, ctx: StepContext) -> dict[str, Any]:
        return dump_live(self.criu, ctx.facts["template_pid"], ctx.workdir / IMAGE_DIR, ctx)

    def discard_template(self, ctx: StepContext) -> None:
        discard_images(ctx.workdir / IMAGE_DIR)

    def restore_template(self, ctx: StepContext) -> dict[str, Any]:
        capsule = ctx.facts["capsule"]
        control = self.control_root / capsule["template_id"]
        control.mkdir(parents=True, exist_ok=True, mode=0o700)
        (control / RELEASE).unlink(missing_ok=True)
        _make_room_for_socket(capsule.get("forkserver_address"))
        tree = self.criu.restore(
            Path(ctx.facts["image_dir"]),
            work_dir=ctx.workdir / "criu-restore",
            detached=True,
            output=ctx.workdir / "engine.log",  # not the capture's log: it may be gone
            timeout=ctx.remaining(),
        )
        facts = {
            "template_pid": tree.pid,
            **engine_stamp(tree.pid),
            "control_dir": str(control),
            "engine_log": str(ctx.workdir / "engine.log"),
            "restore_seconds": tree.seconds,
        }
        ctx.record(**facts)
        return facts

    # -- the engine ---------------------------------------------------------------------------

    def release_template(self, ctx: StepContext) -> dict[str, Any]:
        request = ctx.request
        if request.operation == "restore":  # only a restore has (and declares) a capsule
            captured_tp = (ctx.facts.get("capsule") or {}).get("tp_size")
            if request.tp is None and captured_tp:  # build as many ranks as captured
                request = attrs.evolve(request, tp=captured_tp)
        pid = ctx.facts["template_pid"]
        runtime_dir = _carried_runtime_dir(pid)
        if runtime_dir is not None and host_dir_to_make(str(runtime_dir)):
            ctx.record(runtime_dir=str(runtime_dir))  # journaled first: a stop finds it made
            make_host_dir(str(runtime_dir))
        engine = self.launcher.command(
            request, ctx.workdir, weights=launch_weights(ctx), runtime_dir=runtime_dir
        )
        argv = list(engine.argv)
        at = argv.index("-m") if "-m" in argv[1:3] else -1  # interpreter flags may stand before
        if at < 1 or len(argv) < at + 2:
            raise ComponentError(
                f"the launcher's engine command must be 'python [-FLAG] -m MODULE ...' for n580 "
                f"(the template runs the module), got {argv[:4]}"
            )
        control = Path(ctx.facts["control_dir"])
        order = {
            "format": 1,
            "kind": "coldsnap.template-release",
            "module": argv[at + 1],
            "args": argv[at + 2 :],
            "env": engine.env,
            "cwd": engine.cwd,
        }
        write_json_atomic(control / RELEASE, order)
        facts = {
            "engine_pid": pid,
            "engine_url": engine.url,
            "runtime_dir": engine.env.get("COLDSNAP_RUNTIME_DIR"),
        }
        ctx.record(**facts)
        _wait_status(control, "released", pid, ctx, self.processes)
        return facts

    def stop_engine(self, ctx: StepContext) -> None:
        self._stop(ctx, ctx.facts.get("engine_pid") or ctx.facts.get("template_pid"))

    def retire_source(self, ctx: StepContext) -> None:
        # The source is dumped (its state is in the sealed image) and quiesced: a graceful
        # drain has nothing left to save, and SGLang's would only start after its SIGTERM
        # watchdog's next 5 s poll. So the whole tree is killed at once.
        self._stop(ctx, ctx.facts["engine_pid"], kill=True)


def _carried_runtime_dir(pid: int) -> Path | None:
    """The runtime dir the template was launched with, which its engine keeps: /proc shows every
    process of the tree with the environment the template started with (CRIU restores it as it
    was; a forkserver's children inherit it), whatever the release adds to `os.environ`. A
    fresh dir would name the engine by a dir none of its processes carries: status would say
    it does not run, and a stop's check for live users of the dir would find none. None for a
    template launched without one, or one that ended (the launcher then makes one; the wait
    for the release names the ended template)."""
    found = runtime_dirs_of(pid)
    return Path(found.pop()) if found else None


def _wait_status(
    control: Path, state: str, pid: int, ctx: StepContext, processes: Processes
) -> dict[str, Any]:
    path = control / STATUS
    while True:
        ctx.check()
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            status = {}
        if status.get("state") == state and status.get("pid") == pid:
            return status
        if not processes.alive(pid):
            raise TemplateEnded(
                f"the template (pid {pid}) ended before '{state}'; see {ctx.workdir / 'engine.log'}"
            )
        time.sleep(0.02)


def _make_room_for_socket(address: str | None) -> None:
    """CRIU binds a restored listening unix socket at its old path: the directory must exist
    (the template's exit removed it) and nothing may sit at the path (a crashed copy's socket).
    """
    if not address or address.startswith("\0"):
        return
    path = Path(address)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_socket():
        path.unlink()
