"""In-memory doubles of the four roles (driver, weight provider, engine adapter, store) over one
pretend host, the `MemoryWorld`.

For tests and the conformance kit's self-check only: nothing here touches a process or a file.
Each double implements its role's protocol (coldsnap.machine) and returns exactly the facts its
steps declare in `makes`; none returns `Skipped`. What a real component decides from what it can
do, a double decides from its `capabilities` too: the n610 double has `cuda` (so the CUDA steps
run in the model) unless built without, the engine double has `cuda_graphs` unless built
without, the native provider has `payload` and the recovery one `checkpoint`.

The world keeps every live resource under a key, so a test can say what "safe" means
(`transient()` equal to what it was before a rolled-back operation) and compare the world after
a resumed run with the world after an uninterrupted one (`snapshot()`).

`memory_registry(world)` registers the real n580 and n610 specs with these doubles as their
factories, in a private `Registry`: `Machine(**memory_components(world, request),
registry=...)` runs the real specs on the model.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import define, field

from coldsnap.artifacts import Difference
from coldsnap.drivers import n580, n610
from coldsnap.drivers._facts import DUMP_SECONDS, ENGINE_START, RESTORE_SECONDS
from coldsnap.drivers.n580._specs import (
    CONTROL_DIR,
    FORKSERVER_ADDRESS,
    IMPORT_SECONDS,
    TEMPLATE_ID,
    TEMPLATE_PID,
)
from coldsnap.drivers.n610 import CUDA_PIDS
from coldsnap.engines._args import differences
from coldsnap.machine import (
    CommandLineError,
    InstalledBuild,
    LaunchCommand,
    LaunchLine,
    Registry,
    StepContext,
    WeightSource,
    launch_weights,
)
from coldsnap.machine import steps as s

PROVIDER_CAPABILITIES = {"native": frozenset({"payload"}), "recovery": frozenset({"checkpoint"})}
"""The capabilities of the provider doubles, by the name they stand for."""

CHECKPOINT_FILE = "model.safetensors"


def _digest(data: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _tokens(weights: str) -> list[int]:
    return list(hashlib.sha256(weights.encode()).digest()[:8])


def _size(data: Any) -> int:
    return len(json.dumps(data, sort_keys=True))


def _op(ctx: StepContext) -> str:
    """The operation's name: its workdir's last component (stable across a resume)."""
    return os.path.basename(ctx.request.workdir.rstrip("/"))


def _stamp(ctx: StepContext, pid: int) -> dict[str, Any]:
    """A pretend process's start stamp (ENGINE_START): its operation and PID, unique here."""
    return {ENGINE_START.name: f"memory:{_op(ctx)}:{pid}"}


def checkpoint_weights(path: str) -> str:
    """What loading the checkpoint at `path` puts into an engine. The world's weights are names:
    a checkpoint holds the weights named after its directory, wherever that lies (so two worlds
    built in different temporary folders compare equal)."""
    return f"w:{Path(path).name}"


@define
class MemoryWorld:
    """One pretend host: processes, process images and exports (transient resources, each under
    a string key), files laid out in workdirs, and the published capsules and their tags."""

    identity: dict[str, Any] = field(factory=lambda: {"engine": "memory", "cuda": "none", "tp": 1})
    cuda: bool = True
    resources: dict[str, dict[str, Any]] = field(factory=dict)
    files: dict[str, dict[str, Any]] = field(factory=dict)
    capsules: dict[str, dict[str, Any]] = field(factory=dict)
    names: dict[str, str] = field(factory=dict)
    calls: list[str] = field(factory=list)
    _pids: Any = field(factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(factory=threading.Lock)

    # -- processes ----------------------------------------------------------------------------

    def spawn(self, **state: Any) -> int:
        with self._lock:
            pid = next(self._pids)
            self.resources[f"process:{pid}"] = dict(state)
            return pid

    def process(self, pid: int | None) -> dict[str, Any]:
        proc = self.resources.get(f"process:{pid}")
        if proc is None:
            raise RuntimeError(f"process {pid} is not running")
        return proc

    def alive(self, pid: int | None) -> dict[str, Any] | None:
        return self.resources.get(f"process:{pid}")

    def kill(self, pid: int | None) -> None:
        self.resources.pop(f"process:{pid}", None)

    def boot(self, command: LaunchCommand, request: Any) -> dict[str, Any]:
        """The state of an engine started by `command`: it loads its weights from the payload
        named in its environment (a native restore) or from the request's checkpoint."""
        payload = command.env.get("COLDSNAP_ARTIFACT_DIR")
        if payload is not None:
            if payload not in self.files:
                raise RuntimeError(f"the engine found no payload at {payload}")
            weights = self.files[payload]["weights"]
        elif request.model is not None:
            weights = checkpoint_weights(request.model.path)
        else:
            raise RuntimeError("the engine was given neither a payload nor a checkpoint")
        return {
            "kind": "engine",
            "url": command.url,
            "exports": "COLDSNAP_EXPORT_MODEL_PAYLOAD" in command.env,
            "reloads": checkpoint_weights(request.model.path) if request.model else None,
            "weights": weights,
            "kv": "resident",
            "graphs": True,
            "cache": "warm",
            "cuda": "running" if self.cuda else None,
            "stopped": False,
        }

    # -- images, files and capsules -----------------------------------------------------------

    def read(self, key: str) -> dict[str, Any]:
        """A transient resource (an image just dumped) or a file laid out by an admission."""
        found = self.resources.get(key, self.files.get(key))
        if found is None:
            raise RuntimeError(f"nothing at {key}")
        return found

    # -- what tests compare -------------------------------------------------------------------

    def inventory(self) -> frozenset[str]:
        """What is live: resources and published capsules. Equal before and after a rollback."""
        return frozenset(self.resources) | frozenset(f"capsule:{d}" for d in self.capsules)

    def transient(self) -> frozenset[str]:
        """Processes, images and exports: what an operation must not leak."""
        return frozenset(self.resources)

    def snapshot(self) -> dict[str, Any]:
        """The observable state (workdir files aside), with PIDs renamed by order so that two
        runs compare equal."""
        order = {
            k: f"process:#{i}"
            for i, k in enumerate(
                sorted(
                    (k for k in self.resources if k.startswith("process:")),
                    key=lambda k: int(k[8:]),
                )
            )
        }
        resources = {order.get(k, k): v for k, v in self.resources.items()}
        return {"resources": resources, "capsules": self.capsules, "names": self.names}


class MemoryLauncher:
    """The engine's command line in the world: deterministic per operation (its workdir's name),
    so that a resumed run and an uninterrupted one start identical engines. Like the real
    launchers, a capture with a payload provider starts the engine to export its weights on
    release, and a restore with one starts it from the payload laid out in the workdir."""

    template_preload: tuple[str, ...] = ("memory-engine",)
    forkserver_preload: tuple[str, ...] | None = None

    def __init__(self, world: MemoryWorld) -> None:
        self.world = world

    def command(
        self,
        request: Any,
        workdir: Path,
        *,
        weights: WeightSource,
        runtime_dir: Path | None = None,
    ) -> LaunchCommand:
        op = Path(workdir).name
        runtime = str(runtime_dir) if runtime_dir else f"/memory/run/{op}"
        env = {"COLDSNAP_RUNTIME_DIR": runtime, "COLDSNAP_MODE": request.operation}
        if request.operation == "capture" and weights.payload:
            env["COLDSNAP_EXPORT_MODEL_PAYLOAD"] = "1"
        if request.operation == "restore" and weights.payload:
            env["COLDSNAP_ARTIFACT_DIR"] = str(weights.payload_dir)
        return LaunchCommand(argv=("memory-engine",), env=env, url=f"http://memory/{op}")


class _Double:
    capabilities: frozenset[str] = frozenset()

    def __init__(self, world: MemoryWorld, name: str) -> None:
        self.world = world
        self.name = name

    def _call(self, ctx: StepContext, what: str) -> None:
        self.world.calls.append(("comp:" if ctx.compensating else "") + what)


# -- drivers ------------------------------------------------------------------------------------


class _MemoryDriver(_Double):
    def __init__(self, world: MemoryWorld, name: str, launcher: MemoryLauncher | None) -> None:
        super().__init__(world, name)
        self.launcher = launcher or MemoryLauncher(world)

    def _command(self, ctx: StepContext) -> LaunchCommand:
        return self.launcher.command(ctx.request, ctx.workdir, weights=launch_weights(ctx))

    def _dump(self, ctx: StepContext, pid: int) -> dict[str, Any]:
        image = dict(self.world.process(pid))
        key = f"image:{_op(ctx)}"
        self.world.resources[key] = image
        return {s.IMAGE_DIR.name: key, s.IMAGE_BYTES.name: _size(image), DUMP_SECONDS.name: 0.0}

    def _discard(self, ctx: StepContext) -> None:
        self.world.resources.pop(f"image:{_op(ctx)}", None)

    def stop_engine(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.stop_engine")
        self.world.kill(ctx.facts.get(s.ENGINE_PID.name))

    def retire_source(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.retire_source")
        self.world.kill(ctx.facts[s.ENGINE_PID.name])


class MemoryProcessDriver(_MemoryDriver):
    """The n610 double: launches the engine, moves its CUDA state, dumps and restores the whole
    process. With `cuda` (the default: the world's), it has the `cuda` capability; a dump of a
    process whose CUDA context is live is refused, as the real driver's would fail."""

    def __init__(
        self,
        world: MemoryWorld,
        launcher: MemoryLauncher | None = None,
        *,
        name: str = "n610",
        cuda: bool | None = None,
    ) -> None:
        super().__init__(world, name, launcher)
        cuda = world.cuda if cuda is None else cuda
        self.capabilities = frozenset({"cuda"}) if cuda else frozenset()

    def launch_engine(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.launch_engine")
        command = self._command(ctx)
        pid = self.world.spawn(**self.world.boot(command, ctx.request))
        ctx.record(**{s.ENGINE_PID.name: pid}, **_stamp(ctx, pid))
        return {
            s.ENGINE_PID.name: pid,
            **_stamp(ctx, pid),
            s.ENGINE_URL.name: command.url,
            s.ENGINE_LOG.name: str(ctx.workdir / "engine.log"),
            s.RUNTIME_DIR.name: command.env["COLDSNAP_RUNTIME_DIR"],
        }

    # CUDA: each call moves the state of every process in `cuda_pids` one way, idempotently.
    def _cuda(self, ctx: StepContext, what: str, expect: str, to: str) -> None:
        self._call(ctx, f"driver.{what}")
        for pid in ctx.facts.get(CUDA_PIDS.name) or ():
            proc = self.world.alive(pid)
            if proc is None:
                if ctx.compensating:
                    continue  # the process is gone: nothing left to undo
                raise RuntimeError(f"{what}: process {pid} is not running")
            if proc["cuda"] == expect:
                proc["cuda"] = to
            elif proc["cuda"] != to and not ctx.compensating:
                raise RuntimeError(f"{what}: CUDA state is {proc['cuda']}, expected {expect}")

    def cuda_lock(self, ctx: StepContext) -> dict[str, Any]:
        pids = ctx.facts.get(CUDA_PIDS.name)
        if pids is None:
            pid = ctx.facts[s.ENGINE_PID.name]
            pids = [pid] if self.world.process(pid).get("cuda") else []
            ctx.record(**{CUDA_PIDS.name: pids})  # before locking: the unlock must find them
        self._cuda(ctx, "cuda_lock", "running", "locked")
        return {CUDA_PIDS.name: pids}

    def cuda_unlock(self, ctx: StepContext) -> None:
        self._cuda(ctx, "cuda_unlock", "locked", "running")

    def cuda_checkpoint(self, ctx: StepContext) -> None:
        self._cuda(ctx, "cuda_checkpoint", "locked", "checkpointed")

    def cuda_restore(self, ctx: StepContext) -> None:
        # The real driver continues the tree first: the CUDA API does not answer when stopped.
        for pid in ctx.facts.get(CUDA_PIDS.name) or ():
            proc = self.world.alive(pid)
            if proc is not None:
                proc["stopped"] = False
        self._cuda(ctx, "cuda_restore", "checkpointed", "locked")

    def dump(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.dump")
        pid = ctx.facts[s.ENGINE_PID.name]
        proc = self.world.process(pid)
        if proc["weights"] != "released":
            raise RuntimeError("refusing to dump an engine whose weights are resident")
        if proc.get("cuda") in ("running", "locked"):
            raise RuntimeError(f"process {pid} holds a live CUDA context: CRIU cannot dump it")
        return self._dump(ctx, pid)

    def discard_dump(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.discard_dump")
        self._discard(ctx)

    def restore(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.restore")
        image = self.world.read(ctx.facts[s.IMAGE_DIR.name])
        capsule = ctx.facts[s.CAPSULE.name]
        pid = self.world.spawn(**{**image, "stopped": True})
        ctx.record(**{s.ENGINE_PID.name: pid}, **_stamp(ctx, pid))
        return {
            s.ENGINE_PID.name: pid,
            **_stamp(ctx, pid),
            s.ENGINE_URL.name: capsule[s.ENGINE_URL.name],
            s.ENGINE_LOG.name: str(ctx.workdir / "engine.log"),
            s.RUNTIME_DIR.name: capsule[s.RUNTIME_DIR.name],
            n610.RUNTIME_DIR_MADE.name: True,  # the memory world keeps no directories
            n610.RUNTIME_DIR_AS.name: capsule[s.RUNTIME_DIR.name],
            RESTORE_SECONDS.name: 0.0,
            CUDA_PIDS.name: [pid] if image.get("cuda") else [],
        }

    def resume_processes(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.resume_processes")
        self.world.process(ctx.facts[s.ENGINE_PID.name])["stopped"] = False


class MemoryTemplateDriver(_MemoryDriver):
    """The n580 double: a context-free template, dumped, restored and released into an engine
    that loads its weights from the payload or the checkpoint at release."""

    def __init__(
        self, world: MemoryWorld, launcher: MemoryLauncher | None = None, *, name: str = "n580"
    ) -> None:
        super().__init__(world, name, launcher)

    def launch_template(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.launch_template")
        command = self._command(ctx)
        template_id = f"template-{_op(ctx)}"
        pid = self.world.spawn(kind="template", cuda_mapping=False, url=command.url)
        facts = {
            TEMPLATE_PID.name: pid,
            **_stamp(ctx, pid),
            TEMPLATE_ID.name: template_id,
            CONTROL_DIR.name: f"/memory/control/{template_id}",
            s.ENGINE_LOG.name: str(ctx.workdir / "engine.log"),
        }
        ctx.record(**facts)
        return {
            **facts,
            IMPORT_SECONDS.name: 0.0,
            FORKSERVER_ADDRESS.name: None,
        }

    def stop_template(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.stop_template")
        self.world.kill(ctx.facts.get(TEMPLATE_PID.name))

    def check_context_free(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.check_context_free")
        if self.world.process(ctx.facts[TEMPLATE_PID.name]).get("cuda_mapping"):
            raise RuntimeError("the template maps /dev/nvidiactl")

    def dump_template(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.dump_template")
        return self._dump(ctx, ctx.facts[TEMPLATE_PID.name])

    def discard_template(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.discard_template")
        self._discard(ctx)

    def restore_template(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.restore_template")
        image = self.world.read(ctx.facts[s.IMAGE_DIR.name])
        template_id = ctx.facts[s.CAPSULE.name][TEMPLATE_ID.name]
        pid = self.world.spawn(**image)
        ctx.record(**{TEMPLATE_PID.name: pid}, **_stamp(ctx, pid))
        return {
            TEMPLATE_PID.name: pid,
            **_stamp(ctx, pid),
            CONTROL_DIR.name: f"/memory/control/{template_id}",
            s.ENGINE_LOG.name: str(ctx.workdir / "engine.log"),
            RESTORE_SECONDS.name: 0.0,
        }

    def release_template(self, ctx: StepContext) -> dict[str, Any]:
        """The template turns into the engine and keeps its PID, as a released template does."""
        self._call(ctx, "driver.release_template")
        pid = ctx.facts[TEMPLATE_PID.name]
        proc = self.world.process(pid)
        if proc["kind"] != "template":
            raise RuntimeError(f"process {pid} was released already")
        command = self._command(ctx)
        facts = {
            s.ENGINE_PID.name: pid,
            s.ENGINE_URL.name: command.url,
            s.RUNTIME_DIR.name: command.env["COLDSNAP_RUNTIME_DIR"],
        }
        ctx.record(**facts)
        proc.clear()
        proc.update(self.world.boot(command, ctx.request))
        return facts

    def stop_engine(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.stop_engine")
        self.world.kill(ctx.facts.get(s.ENGINE_PID.name) or ctx.facts.get(TEMPLATE_PID.name))


# -- engine ---------------------------------------------------------------------------------------


class MemoryEngine(_Double):
    """The engine's endpoints as steps, acting on the pretend process `engine_pid`. With
    `graphs` (the default) it has the `cuda_graphs` capability."""

    def __init__(
        self,
        world: MemoryWorld,
        name: str = "sglang",
        *,
        graphs: bool = True,
        launcher: MemoryLauncher | None = None,
    ) -> None:
        super().__init__(world, name)
        self.capabilities = frozenset({"cuda_graphs"}) if graphs else frozenset()
        self.launcher = launcher or MemoryLauncher(world)

    def build(self) -> InstalledBuild:
        return InstalledBuild(
            engine="memory",
            version="1",
            contract=_digest(self.world.identity),
            plugin_digest=_digest("memory-plugin"),
        )

    @staticmethod
    def check_engine_args(args: Sequence[str]) -> list[tuple[str, str]]:
        return []  # the pretend engine takes every argument (and binds it: below)

    @staticmethod
    def check_engine_options(options: Mapping[str, str]) -> list[tuple[str, str]]:
        return []  # the pretend engine takes every option

    def parse_command_line(self, argv: Sequence[str]) -> LaunchLine:
        raise CommandLineError([("command", "the in-memory engine has no launch command line")])

    def engine_args_differences(
        self, captured: Sequence[str], requested: Sequence[str]
    ) -> list[Difference]:
        return differences(captured, requested)  # every argument binds

    def engine_options_differences(
        self, captured: Mapping[str, str], requested: Mapping[str, str]
    ) -> list[Difference]:
        keys = sorted(set(captured) | set(requested))  # every option binds
        return [
            Difference(f"engine_options.{k}", captured.get(k), requested.get(k))
            for k in keys
            if captured.get(k) != requested.get(k)
        ]

    def _proc(self, ctx: StepContext) -> dict[str, Any]:
        return self.world.process(ctx.facts.get(s.ENGINE_PID.name))

    def _set(self, ctx: StepContext, what: str, **state: Any) -> None:
        self._call(ctx, f"engine.{what}")
        proc = self.world.alive(ctx.facts.get(s.ENGINE_PID.name))
        if proc is None:
            if ctx.compensating:
                return  # the process is gone: nothing left to undo
            raise RuntimeError(f"{what}: the engine is not running")
        proc.update(state)

    def wait_healthy(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "engine.wait_healthy")
        proc = self._proc(ctx)
        if proc.get("url") != ctx.facts[s.ENGINE_URL.name]:
            raise RuntimeError(f"nothing answers at {ctx.facts[s.ENGINE_URL.name]}")
        ready = (
            not proc.get("stopped")
            and str(proc.get("weights")).startswith("w:")
            and proc.get("kv") == "resident"
            and proc.get("cuda") in (None, "running")
        )
        if not ready:
            raise RuntimeError("the engine is not healthy")
        return {s.HEALTHY_AFTER_S.name: 0.0}

    def record_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "engine.record_acceptance")
        return {s.ACCEPTANCE_TOKENS.name: _tokens(self._proc(ctx)["weights"])}

    def check_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "engine.check_acceptance")
        got = _tokens(self._proc(ctx)["weights"])
        want = ctx.facts[s.CAPSULE.name][s.ACCEPTANCE_TOKENS.name]
        if got != want:
            raise RuntimeError(f"acceptance tokens differ: captured {want}, restored {got}")
        return {s.ACCEPTANCE_TOKENS.name: got}

    def quiesce(self, ctx: StepContext) -> None:
        self._set(ctx, "quiesce", cache="empty")

    def release_memory(self, ctx: StepContext) -> dict[str, Any]:
        """An engine started to export writes its weights to the export first; `export_dir` is
        where it does (a provider without `payload` never looks)."""
        self._call(ctx, "engine.release_memory")
        proc = self._proc(ctx)
        key = f"export:{_op(ctx)}"
        if proc["exports"] and proc["weights"] != "released":
            self.world.resources[key] = {"weights": proc["weights"]}
        proc.update(weights="released", kv="released")
        tp = getattr(ctx.request, "tp", None) or 1
        return {
            s.EXPORT_DIR.name: key,
            s.RESIDUAL_DEVICE_BYTES.name: 0,
            s.TP_SIZE.name: tp,
            s.RANK_PIDS.name: {},
            s.SHAPE_COVERAGE.name: None,  # a toy engine warms no graph shapes
        }

    def resume_memory(self, ctx: StepContext) -> None:
        """Undoes release: the weights come back from the checkpoint, and the export the release
        wrote is the engine's own scratch, deleted."""
        self.world.resources.pop(f"export:{_op(ctx)}", None)
        proc = self.world.alive(ctx.facts.get(s.ENGINE_PID.name)) or {}
        self._set(ctx, "resume_memory", weights=proc.get("reloads"), kv="resident")

    def destroy_graphs(self, ctx: StepContext) -> None:
        self._set(ctx, "destroy_graphs", graphs=False)

    def recapture_graphs(self, ctx: StepContext) -> None:
        self._set(ctx, "recapture_graphs", graphs=True)

    def rehearse_refill(self, ctx: StepContext) -> None:
        """Refills as a restore would (the exported payload, or the checkpoint), compares the
        acceptance tokens, and leaves the engine released again either way."""
        self._call(ctx, "engine.rehearse_refill")
        source = WeightSource.from_fact(ctx.facts[s.WEIGHT_SOURCE.name])
        if source.payload:
            weights = self.world.read(ctx.facts[s.PAYLOAD_DIR.name])["weights"]
        else:
            weights = checkpoint_weights(str(source.checkpoint))
        want = ctx.facts[s.ACCEPTANCE_TOKENS.name]
        self._proc(ctx).update(weights="released", kv="released")
        if _tokens(weights) != want:
            raise RuntimeError(
                f"the engine answers differently after a release and refill: recorded {want}, "
                f"refilled {_tokens(weights)}"
            )

    def resume_weights(self, ctx: StepContext) -> dict[str, Any]:
        source = WeightSource.from_fact(ctx.facts[s.WEIGHT_SOURCE.name])
        if source.payload:
            weights = self.world.read(source.payload_dir)["weights"]
        else:
            weights = checkpoint_weights(source.checkpoint)
        self._set(ctx, "resume_weights", weights=weights)
        return {s.RESUME_SEED.name: 0}

    def resume_rest(self, ctx: StepContext) -> None:
        self._set(ctx, "resume_rest", kv="resident", graphs=True)

    # The double is one process without rank reports (no `rank_reports` capability): the
    # specs' rank steps are never selected for it; these answer for a single rank.
    def check_ranks(self, ctx: StepContext) -> None:
        self._call(ctx, "engine.check_ranks")

    def tp_barrier(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "engine.tp_barrier")
        return {s.TP_RANKS.name: {"scheduler-tp0": {"pid": None}}}


# -- weight provider ------------------------------------------------------------------------------


class MemoryProvider(_Double):
    """Payload exports and pinned checkpoints in the world. Its capabilities come from the name
    it stands for (`native`: payload, `recovery`: checkpoint) unless given."""

    def __init__(
        self, world: MemoryWorld, name: str = "native", capabilities: Iterable[str] | None = None
    ) -> None:
        super().__init__(world, name)
        default = PROVIDER_CAPABILITIES.get(name, frozenset())
        self.capabilities = frozenset(default if capabilities is None else capabilities)

    def launch_weights(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "provider.launch_weights")
        if "payload" in self.capabilities:
            source = WeightSource(source="payload")
        else:
            source = WeightSource(source="checkpoint", checkpoint=ctx.request.model.path)
        return {s.WEIGHT_SOURCE.name: source.to_fact()}

    def export(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "provider.export")
        export = self.world.read(ctx.facts[s.EXPORT_DIR.name])
        return {
            s.PAYLOAD_DIR.name: ctx.facts[s.EXPORT_DIR.name],
            s.PAYLOAD_BYTES.name: _size(export),
            s.PACKS.name: 1,
        }

    def discard_export(self, ctx: StepContext) -> None:
        self._call(ctx, "provider.discard_export")
        export = ctx.facts.get(s.PAYLOAD_DIR.name) or ctx.facts.get(s.EXPORT_DIR.name)
        if export:
            self.world.resources.pop(export, None)

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "provider.stage")
        if "payload" in self.capabilities:
            payload = ctx.facts[s.PAYLOAD_DIR.name]
            if payload is None or payload not in self.world.files:
                raise RuntimeError(f"the capsule has no payload laid out at {payload}")
            source = WeightSource(source="payload", payload_dir=payload, preverified=True)
            return {s.WEIGHT_SOURCE.name: source.to_fact(), s.VERIFY_SECONDS.name: 0.0}
        bound = ctx.facts[s.CAPSULE_CHECKPOINT.name]
        here = checkpoint_files(ctx.request.model.path)
        if here != bound:
            raise RuntimeError(f"the checkpoint is not the one the capsule is bound to: {here}")
        return {
            s.WEIGHT_SOURCE.name: WeightSource(
                source="checkpoint", checkpoint=ctx.request.model.path
            ).to_fact(),
            s.CHECKPOINT_FILES.name: len(here),
        }


def checkpoint_files(path: str) -> dict[str, str]:
    """file name -> digest of the world's checkpoint at `path`."""
    return {CHECKPOINT_FILE: _digest(checkpoint_weights(path))}


# -- store ----------------------------------------------------------------------------------------


class MemoryStore(_Double):
    """Publishes capsules into the world; admits them against the world's identity. What a
    capsule carries besides its image and payload is the spec's carried facts."""

    def __init__(self, world: MemoryWorld, name: str = "store") -> None:
        super().__init__(world, name)

    def discard_layout(self, ctx: StepContext) -> None:
        self._call(ctx, "artifacts.discard_layout")

    def seal(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "artifacts.seal")
        carried = ctx.carried()
        payload = ctx.facts.get(s.PAYLOAD_DIR.name)
        capsule = {
            "driver": ctx.request.driver,
            "model_id": ctx.request.model.id,
            "identity": dict(self.world.identity),
            "image": self.world.read(ctx.facts[s.IMAGE_DIR.name]),
            "payload": self.world.read(payload) if payload else None,
            "checkpoint": checkpoint_files(ctx.request.model.path),
            "facts": carried,
        }
        digest = _digest(capsule)
        tag = ctx.request.name
        facts = {
            s.CAPSULE_DIGEST.name: digest,
            # Content addressing: an identical capsule may exist already; a rollback must then
            # leave it (and the tags others gave it) alone.
            s.CAPSULE_CREATED.name: digest not in self.world.capsules,
            s.CAPSULE_TAG_WAS.name: self.world.names.get(tag) if tag else None,
            s.CAPSULE_BYTES.name: _size(capsule),
        }
        ctx.record(**facts)  # before publishing: unpublish must know what this seal added
        self.world.capsules[digest] = capsule
        if tag:
            self.world.names[tag] = digest  # the newest capture takes the tag
        # The capsule owns the image and the payload now; they leave the operation's scratch.
        self.world.resources.pop(ctx.facts[s.IMAGE_DIR.name], None)
        if payload:
            self.world.resources.pop(payload, None)
        return facts

    def unpublish(self, ctx: StepContext) -> None:
        self._call(ctx, "artifacts.unpublish")
        digest = ctx.facts.get(s.CAPSULE_DIGEST.name)
        tag = ctx.request.name
        if digest and tag and self.world.names.get(tag) == digest:
            previous = ctx.facts.get(s.CAPSULE_TAG_WAS.name)
            if previous:
                self.world.names[tag] = previous
            else:
                del self.world.names[tag]
        created = ctx.facts.get(s.CAPSULE_CREATED.name)
        if digest and created and digest not in self.world.names.values():
            self.world.capsules.pop(digest, None)

    def admit(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "artifacts.admit")
        ref = ctx.request.artifact
        digest = self.world.names.get(ref, ref)
        capsule = self.world.capsules.get(digest)
        if capsule is None:
            raise LookupError(f"no capsule '{ref}' in the store")
        if capsule["driver"] != ctx.request.driver:
            raise ValueError(f"capsule driver {capsule['driver']}, request {ctx.request.driver}")
        diff = [
            f"{k}: expected {v!r}, found {self.world.identity.get(k)!r}"
            for k, v in capsule["identity"].items()
            if self.world.identity.get(k) != v
        ]
        if diff:
            raise ValueError("incompatible capsule:\n" + "\n".join(diff))
        image = f"{ctx.request.workdir}/image"
        self.world.files[image] = capsule["image"]
        payload = None
        if capsule["payload"] is not None:
            payload = f"{ctx.request.workdir}/payload"
            self.world.files[payload] = capsule["payload"]
        return {
            s.VERIFY_IMAGE_SECONDS.name: 0.0,  # nothing to hash in memory
            s.CAPSULE_DIGEST.name: digest,
            s.CAPSULE.name: {
                **capsule["facts"],
                "driver": capsule["driver"],
                "model_id": capsule["model_id"],
            },
            s.IMAGE_DIR.name: image,
            s.CAPSULE_CHECKPOINT.name: capsule["checkpoint"],
            s.CAPSULE_DRAFT_CHECKPOINT.name: {},  # the doubles serve no draft model
            s.PAYLOAD_DIR.name: payload,
        }


# -- registration -------------------------------------------------------------------------------


def register_memory(registry: Registry, world: MemoryWorld, *, graphs: bool = True) -> Registry:
    """Registers the real n580 and n610 specs with the doubles over `world` as their components,
    the providers `native` and `recovery`, the engine `sglang` and the store `store`."""
    registry.register_driver(
        "n610",
        capture=n610.CAPTURE,
        restore=n610.RESTORE,
        build=lambda request, engine: MemoryProcessDriver(world, engine.launcher),
        cls=MemoryProcessDriver,
        capabilities={"resumes_process"},
        doc="in-memory double of n610",
    )
    registry.register_driver(
        "n580",
        capture=n580.CAPTURE,
        restore=n580.RESTORE,
        build=lambda request, engine: MemoryTemplateDriver(world, engine.launcher),
        cls=MemoryTemplateDriver,
        doc="in-memory double of n580",
    )
    for name in PROVIDER_CAPABILITIES:
        registry.register_provider(
            name,
            build=lambda request, name=name: MemoryProvider(world, name),
            capabilities=PROVIDER_CAPABILITIES[name],
            doc=f"in-memory double of {name}",
        )
    registry.register_engine(
        "sglang",
        build=lambda request: MemoryEngine(world, request.engine, graphs=graphs),
        doc="in-memory double of an engine adapter",
    )
    registry.register_store(
        "store",
        build=lambda request, engine: MemoryStore(world),
        doc="in-memory double of the store",
    )
    return registry


def memory_registry(world: MemoryWorld, *, graphs: bool = True) -> Registry:
    """A private registry (no entry points) of the real specs over the doubles of `world`."""
    return register_memory(Registry(entry_points=False), world, graphs=graphs)


def memory_components(world: MemoryWorld, request: Any, *, graphs: bool = True) -> dict[str, Any]:
    """Keyword arguments for `Machine(**...)`: the doubles over `world` that `request` names."""
    return memory_registry(world, graphs=graphs).components(request).by_role()


__all__ = [
    "PROVIDER_CAPABILITIES",
    "MemoryEngine",
    "MemoryLauncher",
    "MemoryProcessDriver",
    "MemoryProvider",
    "MemoryStore",
    "MemoryTemplateDriver",
    "MemoryWorld",
    "checkpoint_files",
    "checkpoint_weights",
    "memory_components",
    "memory_registry",
    "register_memory",
]
