"""n610: the whole initialized engine tree and its CUDA state, without weights and KV cache.

Capture leaves the source running through the dump (`criu dump --leave-running`), so every
step before the seal can still be undone on a live engine; `retire_source` stops it once the
capsule is sealed. Restore brings the tree back stopped, returns its device state through the
CUDA driver's checkpoint API, and only then lets it run.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from coldsnap.backends import Criu, PidCollision, forward
from coldsnap.backends.inet import check_port_free, dial_host, listeners, rebind
from coldsnap.backends.procs import kill_tree, tree_pids
from coldsnap.machine import (
    ComponentError,
    HostNeed,
    Launcher,
    Skipped,
    StepContext,
    launch_weights,
)

from .._errors import DriverError
from .._host import CRIU_OPERATIONS, criu_needs, cuda_need
from .._processes import (
    RUNTIME_ENV,
    Processes,
    discard_host_dir,
    discard_images,
    discard_restore_work,
    discard_unused,
    dump_live,
    engine_stamp,
    env_is,
    find_roots,
    host_dir_to_make,
    make_host_dir,
    operation_dir,
    restored_root,
    still_ours,
)

IMAGE_DIR = "image"


class CudaBackend(Protocol):
    """The CUDA driver's process-checkpoint API (coldsnap.backends.cuda_checkpoint)."""

    def available(self) -> bool: ...
    def has_context(self, pid: int) -> bool: ...
    def lock(self, pid: int, timeout_s: float) -> None: ...
    def unlock(self, pid: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int) -> None: ...


def default_cuda() -> CudaBackend | None:
    """The real backend where the CUDA driver offers it; None on machines without one."""
    try:
        from coldsnap.backends.cuda_checkpoint import CudaCheckpoint
    except ImportError:
        return None
    cuda = CudaCheckpoint()
    return cuda if cuda.available() else None


class N610Driver:
    """Steps of the n610 specs (n610/_specs.py). With a CUDA backend the driver has the `cuda`
    capability, and the specs' CUDA steps run; without one they are not part of the operation,
    and a capsule whose processes held CUDA contexts is refused at admission (its identity names
    the CUDA platform)."""

    name = "n610"

    def __init__(
        self,
        *,
        launcher: Launcher,
        criu: Criu | None = None,
        cuda: CudaBackend | None = None,
        lock_timeout_s: float = 30.0,
        new_pid_namespace: bool = False,
        restore_pid_namespace: bool = False,
    ) -> None:
        """`new_pid_namespace` launches the engine in a PID namespace of its own (its images
        then always restore into a fresh one); `restore_pid_namespace` restores any image into
        a fresh one, so a copy can run while its PIDs are taken here (mind the engine's port)."""
        self.launcher = launcher
        self.criu = criu or Criu()
        self.cuda = cuda
        self.lock_timeout_s = lock_timeout_s
        self.new_pid_namespace = new_pid_namespace
        self.restore_pid_namespace = restore_pid_namespace
        self.processes = Processes()
        self.capabilities = frozenset({"cuda"} if cuda is not None else ())

    def host_needs(self, request: Any) -> list[HostNeed]:
        """A capture or restore runs CRIU (as root), and on a GPU host the checkpoint API
        (checked by the Machine before anything starts); a stop needs neither."""
        if request.operation not in CRIU_OPERATIONS:
            return []
        cuda = cuda_need(self.cuda)
        return [*criu_needs(self.criu), *([cuda] if cuda is not None else [])]

    # -- the source engine --------------------------------------------------------------------

    def launch_engine(self, ctx: StepContext) -> dict[str, Any]:
        command = self.launcher.command(ctx.request, ctx.workdir, weights=launch_weights(ctx))
        facts: dict[str, Any] = {
            "engine_url": command.url,
            "engine_log": str(ctx.workdir / "engine.log"),
            "runtime_dir": command.env.get(RUNTIME_ENV),
        }
        ctx.record(**facts)  # before the spawn: stop_engine finds an unjournaled PID by these
        # Held under a small root: CRIU restores the root's memory after the rest of the tree
        # has restored its own, so with the engine's own process as root a restore would read
        # its hundreds of MB alone, after the others (coldsnap.backends.launch).
        pid = self.processes.start(
            command,
            ctx.workdir / "engine.log",
            new_pid_namespace=self.new_pid_namespace,
            hold=True,
        )
        made = {"engine_pid": pid, **engine_stamp(pid)}
        ctx.record(**made)
        return {**facts, **made}

    def stop_engine(self, ctx: StepContext) -> None:
        """Stops the engine, then removes its runtime dir and CRIU's restore work dir. An
        engine whose PID was never journaled (the orchestrator died between the spawn or the
        restore and its record) is found by its runtime dir or by CRIU's pidfile.

        Every restore of a capsule has the capture's runtime dir in its processes'
        environment (CRIU restores it), so that dir is removed only while no live process
        uses it, and a failed restore removes it only when that restore made it. A replica's
        processes see a dir of its own at that path (`replica_dir`): removed with them."""
        runtime_dir = ctx.facts.get("runtime_dir")
        env_dir = runtime_dir
        if ctx.request.operation != "capture":  # a capture has no capsule, nor may read one
            env_dir = (ctx.facts.get("capsule") or {}).get("runtime_dir") or runtime_dir
        if ctx.request.operation == "restore":
            runtime_dir = runtime_dir or env_dir
        elif ctx.request.operation != "stop":
            env_dir = runtime_dir  # a capture's engine: the launcher named its own
        belongs = env_is(RUNTIME_ENV, env_dir)
        pid = still_ours(ctx, ctx.facts.get("engine_pid"), belongs)
        if ctx.request.operation == "restore":
            found = restored_root(ctx.workdir, belongs)
            if found is not None and self.restore_pid_namespace and not other_pid_namespace(found):
                # CRIU, the init of the replica's namespace, wrote its root's PID as seen from
                # there: on this host that PID is the image's, which another restore of the same
                # capsule holds, with the same environment. Never stop that one.
                found = None
            strays = [] if pid or found is None else [found]
        elif ctx.request.operation == "stop":
            strays = []  # the target's receipt named the engine: nothing was left unjournaled
        else:
            strays = [] if pid else find_roots(belongs)
        self.processes.stop(pid)
        self.processes.stop_strays(strays)
        made = True  # a capture's launcher made it; a stop removes what its engine used
        if ctx.request.operation == "restore":
            made = bool(ctx.facts.get("runtime_dir_made"))
        if runtime_dir and runtime_dir != env_dir:
            discard_host_dir(runtime_dir)  # a replica's own; its processes are stopped
        if made:
            discard_unused(env_dir, belongs)
        discard_restore_work(operation_dir(ctx))

    def retire_source(self, ctx: StepContext) -> None:
        # The source is dumped (its state is in the sealed image) and quiesced: a graceful
        # drain has nothing left to save, and SGLang's would only start after its SIGTERM
        # watchdog's next 5 s poll. A source whose CUDA state is checkpointed could not even
        # finish one (it blocks in its first CUDA call). So the whole tree is killed at once.
        pid = ctx.facts["engine_pid"]
        kill_tree(pid)
        self.processes.stop(pid)  # reaps the launcher and forgets the tree
        runtime_dir = ctx.facts.get("runtime_dir")  # a restore makes it again
        discard_unused(runtime_dir, env_is(RUNTIME_ENV, runtime_dir))

    # -- CUDA ---------------------------------------------------------------------------------

    def _cuda(self) -> CudaBackend:
        if self.cuda is None:  # the `cuda` guard keeps these steps out of such operations
            raise ComponentError("this n610 driver has no CUDA checkpoint backend")
        return self.cuda

    def cuda_lock(self, ctx: StepContext) -> dict[str, Any]:
        cuda = self._cuda()
        pids = ctx.facts.get("cuda_pids")
        if pids is None:
            pids = [p for p in tree_pids(ctx.facts["engine_pid"]) if cuda.has_context(p)]
            ctx.record(cuda_pids=pids)  # before locking: a compensation must find them
        for pid in pids:
            ctx.check()
            cuda.lock(pid, self.lock_timeout_s)
        return {"cuda_pids": pids}

    def cuda_unlock(self, ctx: StepContext) -> Skipped | None:
        return self._each(ctx, "unlock")

    def cuda_checkpoint(self, ctx: StepContext) -> Skipped | None:
        return self._each(ctx, "checkpoint")

    def cuda_restore(self, ctx: StepContext) -> Skipped | None:
        """The driver's restore runs on a thread of the target itself, so a tree that CRIU left
        stopped is continued first (measured on the H200: the API does not answer for a stopped
        process). Nothing runs ahead: every CUDA call blocks while the process is locked, and
        health stays closed until the weights are back."""
        if ctx.facts.get("cuda_pids"):
            self.processes.resume(ctx.facts["engine_pid"])
        return self._each(ctx, "restore")

    def _each(self, ctx: StepContext, action: str) -> Skipped | None:
        """`action` on every process that holds a CUDA context; Skipped when none does (a tree
        on a GPU host that never initialized CUDA), so the receipt does not claim the work."""
        cuda = self._cuda()
        pids = ctx.facts.get("cuda_pids") or ()
        if not pids:
            return Skipped(f"no process of the engine's tree holds a CUDA context to {action}")
        for pid in pids:
            getattr(cuda, action)(pid)  # each call checks the state first: idempotent
        return None

    # -- process images -----------------------------------------------------------------------

    def dump(self, ctx: StepContext) -> dict[str, Any]:
        return dump_live(self.criu, ctx.facts["engine_pid"], ctx.workdir / IMAGE_DIR, ctx)

    def discard_dump(self, ctx: StepContext) -> None:
        discard_images(ctx.workdir / IMAGE_DIR)

    def restore(self, ctx: StepContext) -> dict[str, Any]:
        images = Path(ctx.facts["image_dir"])
        capsule = ctx.facts["capsule"]
        request = ctx.request
        replica = self.restore_pid_namespace
        port, host = getattr(request, "port", None), getattr(request, "host", None)
        listen_host = None
        if replica:
            url, listen_host, port = serve_replica_on(images, capsule["engine_url"], port, host)
        else:
            url = serve_on(images, capsule["engine_url"], port, host)
        capsule_dir = capsule.get("runtime_dir")
        if "runtime_dir_made" not in ctx.facts:  # a retried restore keeps its first answer
            # Journaled before the dirs are made: the compensation removes the capsule's only
            # if this restore made it (a replica of the same capsule that serves already has
            # it); a replica's own dir is always its own.
            own = replica_dir(capsule_dir) if replica and capsule_dir else capsule_dir
            ctx.record(runtime_dir=own, runtime_dir_made=host_dir_to_make(capsule_dir))
        runtime_dir = ctx.facts["runtime_dir"]
        if ctx.facts["runtime_dir_made"]:
            make_host_dir(capsule_dir)
        binds: list[tuple[str, str]] = []
        if runtime_dir and runtime_dir != capsule_dir:
            if not host_dir_to_make(runtime_dir) and not Path(runtime_dir).is_dir():
                raise DriverError(
                    f"a replica's runtime dir must be one to make on this host: {runtime_dir}"
                )
            make_host_dir(runtime_dir)
            binds.append((runtime_dir, capsule_dir))
        # A replica's port on the host is held from here on (refused at once when taken); its
        # forwarder takes it over once the tree's network namespace exists.
        listener = forward.listen(listen_host, port) if listen_host and port else None
        try:
            try:
                tree = self.criu.restore(
                    images,
                    work_dir=ctx.workdir / "criu-restore",
                    stopped=True,
                    detached=True,
                    new_pid_namespace=replica,
                    new_net_namespace=replica,
                    binds=binds,
                    output=ctx.workdir / "engine.log",  # not the capture's log: it may be gone
                    timeout=ctx.remaining(),
                )
            except PidCollision as exc:
                raise DriverError(
                    f"{exc}. To serve another replica of this capsule beside it, restore with "
                    "`--replica` and its own `--port` (a request's `replica: true`)"
                ) from exc
            if listener is not None:
                forward.start(listener, tree.pid, port, ctx.workdir / "forward.log")
        finally:
            if listener is not None:
                listener.close()
        cuda_pids = list(capsule.get("cuda_pids") or ())
        if tree.new_pid_namespace and cuda_pids:  # the capsule names them as its image does
            cuda_pids = host_pids(tree.pid, cuda_pids)
        facts = {
            "engine_pid": tree.pid,
            "engine_url": url,
            "engine_log": str(ctx.workdir / "engine.log"),
            "runtime_dir": runtime_dir,
            "runtime_dir_made": ctx.facts["runtime_dir_made"],
            "runtime_dir_as": capsule_dir if binds else runtime_dir,
            **engine_stamp(tree.pid),
            "restore_seconds": tree.seconds,
            "cuda_pids": cuda_pids,
        }
        ctx.record(**facts)
        return facts

    def resume_processes(self, ctx: StepContext) -> None:
        self.processes.resume(ctx.facts["engine_pid"])


def other_pid_namespace(pid: int) -> bool:
    """Whether `pid` lives in a PID namespace other than this process's."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def host_pids(root: int, image_pids: list[int]) -> list[int]:
    """The host PIDs of the processes of `root`'s tree, restored into a PID namespace of its
    own, that hold `image_pids` there (the innermost of each one's NSpid): the CUDA driver and
    every signal from here name them by their host PIDs. DriverError naming any not found."""
    by_image: dict[int, int] = {}
    for pid in tree_pids(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue  # ended since the scan: if it held a context, it is named missing below
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                by_image[int(line.split()[-1])] = pid
    missing = [p for p in image_pids if p not in by_image]
    if missing:
        raise DriverError(
            f"the restored tree of {root} has no process that holds PID {missing} in its "
            "namespace (the capsule's processes with a CUDA context)"
        )
    return [by_image[p] for p in image_pids]


def serve_on(images: Path, url: str, port: int | None, host: str | None = None) -> str:
    """The URL the restored engine will serve on: the captured one, or with the request's port
    and host, for which the image's listening socket is moved there first (coldsnap.backends.
    inet: the restored process then listens on it, at no cost to the restore's time)."""
    captured = urlsplit(url)
    old_host = captured.hostname or "127.0.0.1"
    new_port, new_host = port or captured.port or 0, host or old_host
    same_host = host is None or host == old_host or (host, old_host) == ("localhost", "127.0.0.1")
    if new_port == captured.port and same_host:
        return url
    check_port_free(new_host, new_port)
    rebind(images, old_port=captured.port or 0, port=new_port, host=host)
    return captured._replace(netloc=f"{dial_host(new_host)}:{new_port}").geturl()


def serve_replica_on(
    images: Path, url: str, port: int | None, host: str | None = None
) -> tuple[str, str, int]:
    """(URL, address, port) a replica serves on: the engine runs in a network namespace of its
    own and is served through a forwarder that listens on the host, on the request's address
    or else the one the image's listening socket had, and on the request's port or else the
    captured one. Inside, the image's socket is moved to that port on the loopback, the only
    address there."""
    captured = urlsplit(url)
    new_port = port or captured.port or 0
    new_host = host
    if new_host is None:
        had = [f.address for f in listeners(images) if f.port in (captured.port, new_port)]
        new_host = had[0] if had and had[0] not in ("?", "::") else captured.hostname
    new_host = new_host or "127.0.0.1"
    check_port_free(new_host, new_port)
    rebind(images, old_port=captured.port or 0, port=new_port, host="127.0.0.1")
    served = captured._replace(netloc=f"{dial_host(new_host)}:{new_port}").geturl()
    return served, new_host, new_port


def replica_dir(capsule_dir: str) -> str:
    """A replica's own runtime dir, beside the capsule's: its processes see it at the
    capsule's path (their environment names that one), so the records they write there, and
    the plan a restore writes for them, are never another replica's."""
    return f"{capsule_dir}.replica-{secrets.token_hex(4)}"
