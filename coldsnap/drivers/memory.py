"""In-memory doubles of all four components, over one pretend host (`MemoryWorld`).

For tests, the conformance kit's self-check and `coldsnap demo --dry-run` only: nothing here
touches a process or a file. The world keeps every live resource by key, so a test can say what
"safe" means (`inventory()` equal to what it was before a rolled-back operation) and compare the
world after a resumed run with the world after an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from typing import Any

from attrs import define, field

from coldsnap.machine import Skipped, StepContext


def _digest(data: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _tokens(weights: str) -> list[int]:
    return list(hashlib.sha256(weights.encode()).digest()[:8])


@define
class MemoryWorld:
    """Processes, images, packs and published capsules, each a resource under a string key."""

    identity: dict[str, Any] = field(factory=lambda: {"engine": "memory", "cuda": "none", "tp": 1})
    cuda: bool = True
    resources: dict[str, dict[str, Any]] = field(factory=dict)
    capsules: dict[str, dict[str, Any]] = field(factory=dict)
    names: dict[str, str] = field(factory=dict)
    calls: list[str] = field(factory=list)
    _pids: Any = field(factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(factory=threading.Lock)

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

    def kill(self, pid: int | None) -> None:
        self.resources.pop(f"process:{pid}", None)

    def inventory(self) -> frozenset[str]:
        """What is live: resources and published capsules. Equal before and after a rollback."""
        return frozenset(self.resources) | frozenset(f"capsule:{d}" for d in self.capsules)

    def transient(self) -> frozenset[str]:
        """Processes, images, exports and staged payloads: what an operation must not leak."""
        return frozenset(self.resources)

    def snapshot(self) -> dict[str, Any]:
        """The whole observable state, with PIDs renamed by order so two runs compare equal."""
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


class _Part:
    def __init__(self, world: MemoryWorld, name: str) -> None:
        self.world = world
        self.name = name

    def _call(self, ctx: StepContext, what: str) -> None:
        self.world.calls.append(("comp:" if ctx.compensating else "") + what)

    @staticmethod
    def _op(ctx: StepContext) -> str:
        return os.path.basename(ctx.request.workdir.rstrip("/"))


class MemoryDriver(_Part):
    """Pretends to launch, dump and restore processes; `name` is the driver it stands for."""

    def __init__(self, world: MemoryWorld, name: str = "n610") -> None:
        super().__init__(world, name)

    # engine processes
    def launch_engine(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.launch_engine")
        model = ctx.request.model
        pid = self.world.spawn(
            kind="engine",
            model=model.id,
            weights=f"w:{model.id}",
            kv="resident",
            graphs=True,
            nccl="ready",
            quiesced=False,
            cuda="running" if self.world.cuda else None,
            gate="open",
        )
        ctx.record(engine_pid=pid)
        return {"engine_pid": pid}

    def stop_engine(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.stop_engine")
        self.world.kill(ctx.facts.get("engine_pid"))

    def retire_source(self, ctx: StepContext) -> Skipped | None:
        self._call(ctx, "driver.retire_source")
        if ctx.request.keep_source:
            return Skipped("the request keeps the source running")
        self.world.kill(ctx.facts.get("engine_pid"))
        return None

    # CUDA
    def _cuda(self, ctx: StepContext, what: str, expect: tuple[str, ...], to: str) -> Any:
        self._call(ctx, f"driver.{what}")
        proc = self.world.resources.get(f"process:{ctx.facts.get('engine_pid')}")
        if proc is None or proc.get("cuda") is None:
            if ctx.compensating:
                return None
            return Skipped("the process has no CUDA context")
        if proc["cuda"] in expect:
            proc["cuda"] = to
        elif not ctx.compensating:
            raise RuntimeError(f"{what}: CUDA state is {proc['cuda']}, expected {expect}")
        return None

    def cuda_lock(self, ctx: StepContext) -> Any:
        return self._cuda(ctx, "cuda_lock", ("running",), "locked")

    def cuda_unlock(self, ctx: StepContext) -> Any:
        return self._cuda(ctx, "cuda_unlock", ("locked",), "running")

    def cuda_checkpoint(self, ctx: StepContext) -> Any:
        return self._cuda(ctx, "cuda_checkpoint", ("locked",), "checkpointed")

    def cuda_restore(self, ctx: StepContext) -> Any:
        return self._cuda(ctx, "cuda_restore", ("checkpointed",), "locked")

    # process images
    def dump(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.dump")
        proc = self.world.process(ctx.facts["engine_pid"])
        if proc["weights"] != "released":
            raise RuntimeError("refusing to dump an engine whose weights are resident")
        key = f"image:{self._op(ctx)}"
        self.world.resources[key] = dict(proc)
        return {"image": key}

    def discard_dump(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.discard_dump")
        self.world.resources.pop(f"image:{self._op(ctx)}", None)

    def restore(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.restore")
        image = dict(ctx.facts["capsule"]["image"])
        pid = self.world.spawn(**{**image, "stopped": True, "gate": "closed"})
        ctx.record(engine_pid=pid)
        return {"engine_pid": pid}

    def resume_processes(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.resume_processes")
        self.world.process(ctx.facts["engine_pid"])["stopped"] = False

    # templates (n580)
    def launch_template(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.launch_template")
        pid = self.world.spawn(kind="template", cuda_mapping=False)
        ctx.record(template_pid=pid)
        return {"template_pid": pid}

    def stop_template(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.stop_template")
        self.world.kill(ctx.facts.get("template_pid"))

    def check_context_free(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.check_context_free")
        if self.world.process(ctx.facts["template_pid"]).get("cuda_mapping"):
            raise RuntimeError("the template maps /dev/nvidiactl")

    def dump_template(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.dump_template")
        key = f"template-image:{self._op(ctx)}"
        self.world.resources[key] = dict(self.world.process(ctx.facts["template_pid"]))
        return {"image": key}

    def discard_template(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.discard_template")
        self.world.resources.pop(f"template-image:{self._op(ctx)}", None)

    def restore_template(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "driver.restore_template")
        pid = self.world.spawn(**ctx.facts["capsule"]["image"])
        ctx.record(template_pid=pid)
        return {"template_pid": pid}

    def release_template(self, ctx: StepContext) -> dict[str, Any]:
        """The template turns into the engine; it keeps its PID, as a released template does."""
        self._call(ctx, "driver.release_template")
        pid = ctx.facts["template_pid"]
        proc = self.world.process(pid)
        model = ctx.request.model.id if ctx.request.model else None
        weights = f"w:{model}" if ctx.request.operation == "capture" else "pending"
        proc.update(
            kind="engine",
            model=model,
            weights=weights,
            kv="resident",
            graphs=False,
            nccl="ready",
            quiesced=False,
            cuda=None,
            gate="open",
        )
        ctx.record(engine_pid=pid)
        return {"engine_pid": pid}

    def construct_engine(self, ctx: StepContext) -> None:
        self._call(ctx, "driver.construct_engine")
        proc = self.world.process(ctx.facts["engine_pid"])
        capsule = ctx.facts["capsule"]
        if ctx.request.provider == "native":
            proc["weights"] = capsule["pack"]["weights"]
        else:
            proc["weights"] = f"w:{ctx.request.model.id}"


class MemoryEngine(_Part):
    """The engine's endpoints as steps, acting on the pretend process `engine_pid`."""

    timeouts: dict[str, float] = {}

    def __init__(self, world: MemoryWorld, name: str = "sglang") -> None:
        super().__init__(world, name)

    def _proc(self, ctx: StepContext) -> dict[str, Any]:
        return self.world.process(ctx.facts.get("engine_pid"))

    def _set(self, ctx: StepContext, what: str, **state: Any) -> None:
        self._call(ctx, f"engine.{what}")
        proc = self.world.resources.get(f"process:{ctx.facts.get('engine_pid')}")
        if proc is None:
            if ctx.compensating:
                return  # the process is gone: nothing left to undo
            raise RuntimeError(f"{what}: the engine is not running")
        proc.update(state)

    def wait_healthy(self, ctx: StepContext) -> None:
        self._call(ctx, "engine.wait_healthy")
        proc = self._proc(ctx)
        if proc.get("stopped") or proc.get("weights") in ("released", "pending", "garbage"):
            raise RuntimeError("the engine is not healthy")

    def record_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "engine.record_acceptance")
        return {"acceptance_tokens": _tokens(self._proc(ctx)["weights"])}

    def check_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "engine.check_acceptance")
        got = _tokens(self._proc(ctx)["weights"])
        want = ctx.facts["capsule"]["acceptance_tokens"]
        if got != want:
            raise RuntimeError(f"acceptance tokens differ: captured {want}, restored {got}")
        return {"acceptance_tokens": got}

    def quiesce(self, ctx: StepContext) -> None:
        self._set(ctx, "quiesce", quiesced=True)

    def unquiesce(self, ctx: StepContext) -> None:
        self._set(ctx, "unquiesce", quiesced=False)

    def release_memory(self, ctx: StepContext) -> None:
        self._set(ctx, "release_memory", weights="released", kv="released")

    def resume_memory(self, ctx: StepContext) -> None:
        # Without a CPU backup the contents come back as garbage; a real compensation reloads.
        model = self._proc_model(ctx)
        self._set(ctx, "resume_memory", weights=f"w:{model}", kv="resident")

    def _proc_model(self, ctx: StepContext) -> str | None:
        proc = self.world.resources.get(f"process:{ctx.facts.get('engine_pid')}") or {}
        return proc.get("model")

    def destroy_graphs(self, ctx: StepContext) -> None:
        self._set(ctx, "destroy_graphs", graphs=False)

    def recapture_graphs(self, ctx: StepContext) -> None:
        self._set(ctx, "recapture_graphs", graphs=True)

    def prepare_nccl(self, ctx: StepContext) -> None:
        self._set(ctx, "prepare_nccl", nccl="prepared")

    def restore_nccl(self, ctx: StepContext) -> None:
        self._set(ctx, "restore_nccl", nccl="ready")

    def tp_barrier(self, ctx: StepContext) -> None:
        self._call(ctx, "engine.tp_barrier")
        if self._proc(ctx)["nccl"] != "prepared":
            raise RuntimeError("a rank did not reach the released state")

    def resume_weights(self, ctx: StepContext) -> None:
        self._set(ctx, "resume_weights", weights="garbage")

    def update_weights_from_disk(self, ctx: StepContext) -> None:
        self._set(ctx, "update_weights_from_disk", weights=f"w:{ctx.request.model.id}")

    def resume_rest(self, ctx: StepContext) -> None:
        self._set(ctx, "resume_rest", kv="resident", graphs=True)

    def open_health_gate(self, ctx: StepContext) -> None:
        self._set(ctx, "open_health_gate", gate="open")

    def close_health_gate(self, ctx: StepContext) -> None:
        self._set(ctx, "close_health_gate", gate="closed")


class MemoryProvider(_Part):
    """Native packs and pinned checkpoints as world resources."""

    def __init__(self, world: MemoryWorld, name: str = "native") -> None:
        super().__init__(world, name)

    def export(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "provider.export")
        model = ctx.request.model.id
        self.world.resources[f"export:{self._op(ctx)}"] = {"weights": f"w:{model}"}
        return {"pack": {"weights": f"w:{model}"}}

    def discard_export(self, ctx: StepContext) -> None:
        self._call(ctx, "provider.discard_export")
        self.world.resources.pop(f"export:{self._op(ctx)}", None)

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "provider.stage")
        self.world.resources[f"staged:{self._op(ctx)}"] = {"capsule": ctx.facts["capsule_digest"]}
        return {"staged": True}

    def unstage(self, ctx: StepContext) -> None:
        self._call(ctx, "provider.unstage")
        self.world.resources.pop(f"staged:{self._op(ctx)}", None)

    def hydrate(self, ctx: StepContext) -> None:
        self._call(ctx, "provider.hydrate")
        proc = self.world.process(ctx.facts["engine_pid"])
        proc["weights"] = ctx.facts["capsule"]["pack"]["weights"]


class MemoryStore(_Part):
    """Publishes capsules into the world; admits them against the world's identity."""

    def __init__(self, world: MemoryWorld, name: str = "memory") -> None:
        super().__init__(world, name)

    def seal(self, ctx: StepContext) -> dict[str, Any]:
        self._call(ctx, "artifacts.seal")
        image = self.world.resources[ctx.facts["image"]]
        capsule = {
            "driver": ctx.request.driver,
            "provider": ctx.request.provider,
            "model": ctx.request.model.id,
            "identity": dict(self.world.identity),
            "image": image,
            "pack": ctx.facts.get("pack"),
            "acceptance_tokens": ctx.facts["acceptance_tokens"],
        }
        digest = _digest(capsule)
        # Content addressing: an identical capsule may exist already. A rollback must then leave
        # it (and names others gave it) alone, so record what this operation added.
        created = digest not in self.world.capsules
        self.world.capsules[digest] = capsule
        # The capsule owns the image and the export now; they leave the operation's scratch.
        self.world.resources.pop(ctx.facts["image"], None)
        self.world.resources.pop(f"export:{self._op(ctx)}", None)
        previous = self.world.names.get(ctx.request.name) if ctx.request.name else None
        if ctx.request.name:
            self.world.names[ctx.request.name] = digest  # the newest capture takes the name
        facts = {"capsule_digest": digest, "capsule_created": created, "capsule_name_was": previous}
        ctx.record(**facts)
        return facts

    def unpublish(self, ctx: StepContext) -> None:
        self._call(ctx, "artifacts.unpublish")
        digest = ctx.facts.get("capsule_digest")
        if digest and ctx.request.name and self.world.names.get(ctx.request.name) == digest:
            previous = ctx.facts.get("capsule_name_was")
            if previous:
                self.world.names[ctx.request.name] = previous
            else:
                del self.world.names[ctx.request.name]
        if digest and ctx.facts.get("capsule_created") and digest not in self.world.names.values():
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
        return {"capsule_digest": digest, "capsule": capsule}


def memory_components(
    world: MemoryWorld, driver: str = "n610", provider: str = "native", engine: str = "sglang"
) -> dict[str, Any]:
    """Keyword arguments for `Machine(**...)` over one world."""
    return {
        "driver": MemoryDriver(world, driver),
        "provider": MemoryProvider(world, provider),
        "engine": MemoryEngine(world, engine),
        "artifacts": MemoryStore(world),
    }
