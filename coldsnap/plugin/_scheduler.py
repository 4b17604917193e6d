"""Hooks that run in each scheduler process (one per TP rank): memory, weights, graphs.

Release (weights): check the registry against the live model and export this rank's shard of
the native payload if asked (a failure here refuses the release, nothing freed), SGLang's own
release (KV pause + flush, buffer stash, barrier, weights pause: our adapter returns the host
pages), tear down NCCL, status, TP barrier. Resume, stage 1 (refusals leave the engine released
and the call retryable): read the plan, open and verify this rank's packs or check the
checkpoint paths; then the ranks agree (one rank's refusal is every rank's) and rebuild NCCL.
Stage 2: native (SGLang's resume, hydrate in place, put back the residual) or recovery (resume
weights, put back the residual, reload each runner from its own pinned path through SGLang's
update-from-disk, then the other tags in a second phase); check the registry, status, TP
barrier. The barriers are named barriers over torch.distributed's store with a timeout that
names the ranks missing (coldsnap.plugin._ranks); every path passes one, so no rank is left
waiting, and each rank writes its status before it arrives, so the HTTP-owning rank never
answers before every rank's record is there.

Contract variants (coldsnap.plugin._contracts) decide two things here: whether weights are
committed in a separate `finalize_startup_weight_load` (variant `deferred-commit`, hooked) or
are final when `load_model` returns (`none`: nothing more to hook), and how the runners of a
recovery reload are found (`selector`: SGLang's `_select_runners`; `tp-and-draft-worker`: the
target worker's `model_runner` and the draft worker's `draft_runners`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from coldsnap._atomic import write_json_atomic
from coldsnap._errors import PluginError
from coldsnap._wire import MEMORY_TAGS, PAYLOAD_SOURCE, PLAN_FILE, WEIGHTS, read_plan
from coldsnap._wire import EngineSettings as Settings
from coldsnap.distributed import BarrierError

from . import _nccl, _payload, _shapes
from ._contracts import variant_in_use
from ._memory import HOST_BACKEND, ColdsnapMemorySaverAdapter
from ._ranks import RankSync, StoreUnavailable
from ._records import SHAPE_PLAN_FILE, SHAPE_PLAN_FORMAT, SHAPE_PLAN_KIND, StatusFile
from ._storages import REGISTRY, RegistryError, StorageRegistry

logger = logging.getLogger("coldsnap.plugin")

SG = "sglang.srt"
ALL_TAGS = MEMORY_TAGS
_MR = f"{SG}.model_executor.model_runner.ModelRunner"
_WU = f"{SG}.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
FINALIZE_CONTRACT = f"{_MR}.finalize_startup_weight_load"
SELECT_RUNNERS_CONTRACT = f"{_WU}._select_runners"


def _tags(recv_req: Any) -> list[str]:
    tags = getattr(recv_req, "tags", None)
    return list(tags) if tags else list(ALL_TAGS)


def _with_tags(recv_req: Any, tags: list[str]) -> Any:
    import msgspec

    return msgspec.structs.replace(recv_req, tags=tags)


def _role(runner: Any) -> str:
    if not getattr(runner, "is_draft_worker", False):
        return "target"
    idx = getattr(runner, "draft_model_idx", None)
    return "draft" if not idx else f"draft{idx}"


class TopologyUnreadable(PluginError, RuntimeError):
    """This process's TP group or rank cannot be read: nothing falls back to rank 0 (whose
    pack another rank would then read)."""


def _tp_group() -> Any:
    """SGLang's TP group coordinator of this process; TopologyUnreadable when it has none."""
    where = "sglang.srt.distributed.parallel_state.get_tp_group()"
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group

        group = get_tp_group()
    except (ImportError, AttributeError, AssertionError, RuntimeError) as exc:
        # 0.5.17 asserts the group is initialised; 0.5.23 raises RuntimeError when unwritten
        raise TopologyUnreadable(
            f"the TP group of this process cannot be read ({where}: {type(exc).__name__}: {exc})"
        ) from None
    if group is None:
        raise TopologyUnreadable(f"the TP group of this process cannot be read ({where} is None)")
    return group


def _tp_rank(group: Any = None) -> int:
    """This process's TP rank: from `group` when torch.distributed is up, else from SGLang's TP
    group coordinator; TopologyUnreadable when neither can be read."""
    import torch.distributed as dist

    if group is not None and dist.is_initialized():
        rank = dist.get_rank(group=group)
        where = "torch.distributed.get_rank(TP CPU group)"
    else:
        rank = getattr(_tp_group(), "rank_in_group", None)
        where = "TP group rank_in_group"
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise TopologyUnreadable(f"the TP rank of this process cannot be read: {where} is {rank!r}")
    return rank


class SchedulerHooks:
    """The scheduler-side hooks, bound to this process's settings and status file."""

    def __init__(
        self, settings: Settings, status: StatusFile, registry: StorageRegistry = REGISTRY
    ) -> None:
        self.settings = settings
        self.status = status
        self.registry = registry
        self.async_decode_pending = False
        self.weights_invalid = False
        self.adapters: list[ColdsnapMemorySaverAdapter] = []
        # role -> what the model's checkpoint does not hold, kept at the last weights release
        self.residuals: dict[str, _payload.Residual] = {}
        # the payload directory this process was last refilled from (a restore or a wake): its
        # capsule holds the weights, so no later release exports them again
        self.refilled_from: str | None = None

    def targets(self) -> list[tuple[str, str, Any]]:
        """(target, hook type, hook) for HookRegistry."""
        mr = f"{SG}.model_executor.model_runner.ModelRunner"
        wu = f"{SG}.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
        return [
            (
                f"{SG}.utils.torch_memory_saver_adapter.TorchMemorySaverAdapter.create",
                "AROUND",
                self.create_adapter,
            ),
            (f"{mr}.load_model", "AFTER", self.after_load_model),
            *(
                [(FINALIZE_CONTRACT, "AFTER", self.after_finalize_startup_weight_load)]
                if variant_in_use(FINALIZE_CONTRACT) == "deferred-commit"
                else []
            ),
            (f"{mr}.init_cuda_graphs", "AROUND", self.around_init_cuda_graphs),
            (f"{wu}.release_memory_occupation", "AROUND", self.around_release),
            (f"{wu}.resume_memory_occupation", "AROUND", self.around_resume),
            (
                f"{SG}.model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_disk",
                "AROUND",
                self.around_runner_update_from_disk,
            ),
            (f"{SG}.managers.scheduler.Scheduler.on_idle", "AFTER", self.after_on_idle),
        ]

    # ---------------------------------------------------------------- memory saver
    def create_adapter(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        adapter = ColdsnapMemorySaverAdapter(
            original(*args, **kwargs), live_backing=self.settings.live_backing
        )
        self.adapters.append(adapter)
        return adapter

    # ---------------------------------------------------------------- loaders
    def after_load_model(self, result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(runner, "startup_weight_load", None) is not None:
            return  # weights are committed later, in finalize_startup_weight_load
        self._register(runner)

    def after_finalize_startup_weight_load(
        self, result: Any, runner: Any, *args: Any, **kwargs: Any
    ) -> None:
        self._register(runner)

    def _register(self, runner: Any) -> None:
        role = _role(runner)
        entry = self.registry.register(role, runner.model)
        info = entry.summary()
        self.status.update(
            "registered", registered={**self.status.record.get("registered", {}), role: info}
        )
        if self.settings.mode == "restore" and self.settings.startup_source == PAYLOAD_SOURCE:
            assert self.settings.artifact_dir is not None  # settings cross-check
            src = _payload.pack_dir(self.settings.artifact_dir, _tp_rank(), role)
            t0 = time.perf_counter()
            source, verify_seconds = _payload.prepare(
                entry.model, src, verify=not self.settings.artifact_preverified
            )
            summary = _payload.hydrate(entry.model, source)
            entry.check_live()
            summary["verify_seconds"] = verify_seconds
            summary["seconds"] = time.perf_counter() - t0
            # one loader call per model (the target's, then each draft's): keep every role's
            hydrated = {**(self.status.record.get("startup_hydration") or {}), role: summary}
            self.status.update("startup_hydrated", startup_hydration=hydrated)

    # ---------------------------------------------------------------- release / resume
    def around_release(
        self, original: Any, mgr: Any, recv_req: Any, *args: Any, **kwargs: Any
    ) -> Any:
        tags = _tags(recv_req)
        group = mgr.tp_cpu_group
        op = getattr(recv_req, "rid", None)
        try:
            exports = self._before_release(tags, group, op)
            kept = self._keep_state(tags, group, op, mgr)
        except Exception as exc:
            # Nothing is released yet: the engine keeps serving and the call can be retried.
            logger.error("coldsnap: release refused: %s", traceback.format_exc())
            self._report(group, op, "release_failed", outcome="failed", error=_err(exc))
            return _output("ReleaseMemoryOccupationReqOutput")
        before = set(mgr.offload_tags)
        for adapter in self.adapters:
            adapter.pauses_begun.clear()
        try:
            result = original(mgr, recv_req, *args, **kwargs)
        except Exception as exc:
            # SGLang's release stopped part way. It marks every asked tag released before it
            # pauses any; a region whose pause never began is unchanged, so its mark is taken
            # back: a resume (the orchestrator's compensation) then resumes exactly what may
            # have been released (SGLang's resume of weights it never stashed would fail).
            # Raising here would end the scheduler instead; the failure is reported (the HTTP
            # call fails naming it, and the health gate stays closed unless nothing is left
            # released: then the engine serves on as after a refusal).
            logger.error("coldsnap: release failed: %s", traceback.format_exc())
            begun = set().union(*(a.pauses_begun for a in self.adapters))
            mgr.offload_tags.difference_update(set(mgr.offload_tags) - before - begun)
            self._report(
                group,
                op,
                "release_failed" if set(mgr.offload_tags) == before else "release_failed_part_way",
                outcome="failed",
                error=_err(exc),
                released_tags=sorted(mgr.offload_tags),
            )
            return _output("ReleaseMemoryOccupationReqOutput")
        outcome, error, nccl = "ok", None, None
        try:
            nccl = _nccl.prepare(_tp_group()) if WEIGHTS in tags else None
        except Exception as exc:
            outcome, error = "failed", _err(exc)
        self._report(
            group,
            op,
            "released",
            outcome=outcome,
            error=error,
            released_tags=sorted(mgr.offload_tags),
            freed_by=self._freed_by(),
            discarded_bytes=HOST_BACKEND.last_discarded_bytes if WEIGHTS in tags else 0,
            export=exports,
            nccl=nccl,
            **kept,
        )
        return result

    def _keep_state(self, tags: list[str], group: Any, op: str | None, mgr: Any) -> dict[str, Any]:
        """While the weights are intact: the residual of each model (what its checkpoint does
        not hold) to host memory, and with the disk backing every registered tensor as a native
        pack under the process artifact root. Returns the status fields."""
        if WEIGHTS not in tags:
            return {}
        self.residuals = {}
        if self.settings.keep_residual:
            for _, runner in weight_runners(mgr):
                role = _role(runner)
                path = str(runner.model_config.model_path)
                self.residuals[role] = _payload.keep_residual(
                    role, self.registry.get(role).model, path
                )
        fields: dict[str, Any] = {
            "residual": {r: k.summary() for r, k in self.residuals.items()}
            if self.settings.keep_residual
            else "off"
        }
        if self.settings.live_backing == "disk":
            assert self.settings.process_artifact_root is not None  # settings cross-check
            root = live_root(self.settings.process_artifact_root, op)
            fields["spilled"] = self._export_models(root, _tp_rank(group))
        return fields

    def _before_release(self, tags: list[str], group: Any, op: str | None) -> dict[str, Any] | None:
        """Registers the models again as they serve now and exports the native payload while
        the weights are intact."""
        if WEIGHTS not in tags:
            return None
        self._require_registered()
        self._reregister()
        if not self.settings.export_model_payload or self.refilled_from is not None:
            # Only a capture's release exports. An n610 image keeps the capture's settings, so
            # a sleep of its restored engine would write another full copy each time; the
            # capsule's payload it was refilled from is what a wake reads.
            return None
        assert self.settings.artifact_dir is not None  # settings cross-check
        root = export_root(self.settings.artifact_dir, op)
        return self._export_models(root, _tp_rank(group))

    def _reregister(self) -> None:
        """What is released, exported and later refilled is the model as the engine serves
        with it, not as its loader returned it: SGLang may have replaced tensors since (a
        rotary cache recast on first use or during graph capture). Each role's `registered`
        summary names what moved (`moved`, empty when nothing did)."""
        registered = dict(self.status.record.get("registered") or {})
        for entry in self.registry.models():
            moved = entry.refresh()
            if moved:
                logger.info("coldsnap: %s model re-registered: %s", entry.role, "; ".join(moved))
            registered[entry.role] = {**entry.summary(), "moved": list(moved)}
        self.status.update("reregistered", registered=registered)

    def _export_models(self, root: Any, rank: int) -> dict[str, Any]:
        """Every registered model's native pack under `root` (this rank's part)."""
        exports: dict[str, Any] = {"root": str(root)}
        for entry in self.registry.models():
            exports[entry.role] = _payload.export(
                entry.model, _payload.pack_dir(root, rank, entry.role)
            )
        return exports

    def around_resume(
        self, original: Any, mgr: Any, recv_req: Any, *args: Any, **kwargs: Any
    ) -> Any:
        asked = _tags(recv_req)
        group = mgr.tp_cpu_group
        op = getattr(recv_req, "rid", None)
        # Only what this engine released is resumed. SGLang's own resume raises on a tag that
        # is not released (KeyError in the scheduler's loop, which ends the scheduler), and an
        # orchestrator compensating a release that was refused asks for exactly such tags:
        # the engine it wants back is the one still serving.
        tags = [t for t in asked if t in mgr.offload_tags]
        if WEIGHTS not in tags:
            # Nothing to refill: SGLang's own resume of the released rest, if any (an empty
            # tag list would mean every tag to SGLang).
            result = original(mgr, _with_tags(recv_req, tags), *args, **kwargs) if tags else None
            self._report(
                group,
                op,
                "resumed" if tags else "resume_nothing_released",
                outcome="ok",
                error=None,
                released_tags=sorted(mgr.offload_tags),
            )
            return _resume_output() if result is None else result
        recv_req = _with_tags(recv_req, tags) if tags != asked else recv_req
        self.status.update("resuming", operation=op, outcome="running", error=None)
        if self.weights_invalid:
            self._report(
                group,
                op,
                "resume_refused",
                outcome="refused",
                error="an earlier resume failed after the weights region was resumed; "
                "this engine's weights are not valid and it must be replaced",
            )
            return _resume_output()
        try:
            # Stage 1: everything that can refuse, before any memory changes (retryable).
            plan = read_plan(self._runtime_dir())
            staged = self._stage(plan, _tp_rank(group))
            refusal = None
        except Exception as exc:
            refusal = _err(exc)
        refusal = self._agree_staged(group, op, refusal, staged if refusal is None else None)
        if refusal is not None:
            self._report(group, op, "resume_refused", outcome="refused", error=refusal)
            return _resume_output()
        try:
            # Stage 2: resume the regions and refill the weights.
            detail = self._resume_with(plan, staged, original, mgr, recv_req, tags, args, kwargs)
        except Exception as exc:
            self.weights_invalid = True
            logger.error("coldsnap: resume failed: %s", traceback.format_exc())
            self._report(
                group,
                op,
                "resume_failed",
                outcome="failed",
                error=_err(exc),
                released_tags=sorted(mgr.offload_tags),
            )
            return _resume_output()
        # Every restore of one n610 capsule starts from the same random state; reseed so that
        # replicas do not share a sampling stream.
        detail["reseeded"] = _reseed(plan.seed)
        self._report(
            group,
            op,
            "resumed",
            outcome="ok",
            error=None,
            released_tags=sorted(mgr.offload_tags),
            resume=detail,
        )
        return _resume_output()

    def _agree_staged(
        self, group: Any, op: str | None, refusal: str | None, staged: dict[str, Any] | None
    ) -> str | None:
        """Every rank says whether its stage 1 passed before any of them changes memory or
        rebuilds its NCCL communicators (a collective): one rank's refusal is every rank's, so
        none is left inside a collective the others never enter. Returns this rank's refusal,
        or None once the communicators are back (into `staged`)."""
        try:
            refused = self._ranks(group).agree(op, "staged", ok=refusal is None)
        except (BarrierError, StoreUnavailable) as exc:
            return refusal or _err(exc)
        if refusal is not None:
            return refusal
        if refused:
            return f"rank(s) {', '.join(map(str, refused))} refused this resume at stage 1"
        assert staged is not None
        try:
            staged["nccl"] = _nccl.restore(_tp_group())
        except (_nccl.NcclBoundaryError, TopologyUnreadable) as exc:
            return _err(exc)
        return None

    def _report(self, group: Any, op: str | None, event: str, **fields: Any) -> None:
        """Writes this rank's status, then meets the other ranks at the operation's barrier.

        The record comes first: rank 0 answers the HTTP process only after the barrier, so by
        then every rank's record names the operation and the health gate reads them all. A
        barrier that fails (a rank did not arrive in time, or the store is gone) turns the
        outcome into a failure naming the missing ranks; every path passes the barrier, so no
        rank is left waiting for one that took another branch."""
        self.status.update(event, operation=op, **fields)
        try:
            # One barrier per operation whatever each rank's outcome: a rank that refused
            # meets one that resumed, and neither waits for the other in vain.
            phase = "release" if event.startswith("release") else "resume"
            waited = self._ranks(group).sync(op, phase)
        except (BarrierError, StoreUnavailable) as exc:
            logger.error("coldsnap: rank barrier of %s failed: %s", event, exc)
            self.status.update(
                f"{event}_barrier_failed", operation=op, outcome="failed", error=_err(exc)
            )
            return
        self.status.update(None, barrier_waited_s=round(waited, 3))

    def _ranks(self, group: Any) -> RankSync:
        """This rank's barriers with its TP group (SGLang's TP CPU group names rank and size).
        A process without that group or without torch.distributed has no peer to meet."""
        import torch.distributed as dist

        timeout = self.settings.rank_timeout_s
        if group is None or not dist.is_initialized():
            return RankSync(0, 1, timeout)
        return RankSync(dist.get_rank(group=group), dist.get_world_size(group=group), timeout)

    def _stage(self, plan: Any, rank: int) -> dict[str, Any]:
        """Checks the plan against this rank's registry; opens and verifies native packs."""
        self._require_registered()
        staged: dict[str, Any] = {"nccl": None, "sources": {}, "verify_seconds": {}, "rank": rank}
        if plan.source == PAYLOAD_SOURCE:
            # The plan alone says whether this refill was verified just before: the launch's
            # COLDSNAP_ARTIFACT_PREVERIFIED spoke for the startup hydration only, and a later
            # resume (a wake) must not inherit it.
            verify = not plan.preverified
            for entry in self.registry.models():
                src = _payload.pack_dir(plan.payload_dir, rank, entry.role)
                source, seconds = _payload.prepare(entry.model, src, verify=verify)
                staged["sources"][entry.role] = source
                staged["verify_seconds"][entry.role] = seconds
        else:
            for entry in self.registry.models():
                path = plan.checkpoint if entry.role == "target" else plan.draft_checkpoint
                if not path:
                    raise RuntimeError(
                        f"the resume plan names no checkpoint for the {entry.role} model "
                        "(a draft model recovers from its own path, never the target's)"
                    )
                if not Path(path).is_dir():
                    raise RuntimeError(
                        f"checkpoint {path} for the {entry.role} model is not a directory"
                    )
                load_format = plan.load_format or self.settings.recovery_load_format
                _payload.check_load_format(path, load_format)
                kept = self.residuals.get(entry.role)
                if kept is not None and kept.error:
                    raise _payload.PayloadRefused(
                        f"the {entry.role} model's residual state was not kept at release "
                        f"({kept.error}); a reload alone would leave what the checkpoint does "
                        "not hold as the release left it"
                    )
        return staged

    def _resume_with(
        self,
        plan: Any,
        staged: dict[str, Any],
        original: Any,
        mgr: Any,
        recv_req: Any,
        tags: list[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        detail: dict[str, Any] = {"source": plan.source, "nccl": staged["nccl"]}
        t0 = time.perf_counter()
        if plan.source == PAYLOAD_SOURCE:
            original(mgr, recv_req, *args, **kwargs)
            hydrated = {}
            for entry in self.registry.models():
                hydrated[entry.role] = _payload.hydrate(entry.model, staged["sources"][entry.role])
                hydrated[entry.role]["verify_seconds"] = staged["verify_seconds"][entry.role]
                entry.check_live()
            detail["hydrated"] = hydrated
            self.refilled_from = plan.payload_dir
            detail["residual"] = self._restore_residuals()
        else:
            original(mgr, _with_tags(recv_req, [WEIGHTS]), *args, **kwargs)
            load_format = plan.load_format or self.settings.recovery_load_format
            # What the checkpoint does not hold goes back first: SGLang's reload runs its
            # post-load processing in the same call, right after loading, and that processing
            # must see these tensors as a cold start's does, not as the release left them.
            # The reload itself writes only what the checkpoint names, so none of them.
            detail["residual"] = self._restore_residuals()
            loaded = {}
            for role, runner in weight_runners(mgr):
                path = plan.checkpoint if role == "target" else plan.draft_checkpoint
                ok, message = runner.weight_updater.update_weights_from_disk(path, load_format)
                if not ok:
                    raise RuntimeError(
                        f"update_weights_from_disk({path}) for {role} failed: {message}"
                    )
                loaded[role] = path
            for entry in self.registry.models():
                entry.check_live()
            detail["loaded"] = loaded
            rest = [t for t in tags if t != WEIGHTS]
            if rest:  # second phase: KV cache and graphs once the weights are real
                original(mgr, _with_tags(recv_req, rest), *args, **kwargs)
            detail["second_phase"] = rest
        detail["storages_unchanged"] = True
        detail["seconds"] = time.perf_counter() - t0
        return detail

    def _restore_residuals(self) -> dict[str, Any] | str:
        """Writes back every model's kept residual: after a native hydration, before a
        recovery reload (whose post-load processing must find it in place)."""
        if not self.settings.keep_residual:
            return "off"
        return {
            entry.role: _payload.restore_residual(entry.model, self.residuals[entry.role])
            for entry in self.registry.models()
            if entry.role in self.residuals
        }

    def around_runner_update_from_disk(
        self, original: Any, updater: Any, model_path: str, *args: Any, **kwargs: Any
    ) -> Any:
        """A draft model recovers from its own pinned path, never from the target's."""
        runner = updater.get_model_runner()
        if getattr(runner, "is_draft_worker", False):
            draft_path = self._plan_draft_checkpoint()
            if draft_path and model_path != draft_path:
                logger.info(
                    "coldsnap: draft model reloads from %s instead of %s", draft_path, model_path
                )
                model_path = draft_path
        return original(updater, model_path, *args, **kwargs)

    def _plan_draft_checkpoint(self) -> str | None:
        """The plan's draft checkpoint; None only when there is no plan (an update from disk
        outside a coldsnap resume). A malformed plan is refused (PlanError names the field)."""
        runtime_dir = self._runtime_dir()
        if not (runtime_dir / PLAN_FILE).exists():
            return None
        return read_plan(runtime_dir).draft_checkpoint

    # ---------------------------------------------------------------- graphs
    def around_init_cuda_graphs(self, original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(runner, "is_draft_worker", False):
            return original(runner, *args, **kwargs)
        capture_decode = kwargs.pop("capture_decode_cuda_graph", args[0] if args else True)
        if self.settings.async_cuda_graphs and capture_decode:
            # Serve eagerly first; the decode graph is captured at the first idle boundary
            # after a completed request (after_on_idle).
            self.async_decode_pending = True
            self.status.update("decode_graph_deferred", async_decode_graph="pending")
            capture_decode = False
        result = original(runner, capture_decode_cuda_graph=capture_decode)
        if self.settings.shape_calibration != "off" and not self.async_decode_pending:
            self.calibrate(runner)
        return result

    def after_on_idle(self, result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        if not self.async_decode_pending:
            return
        if getattr(scheduler, "forward_ct", 0) <= 0 or not scheduler.is_fully_idle():
            return
        self.async_decode_pending = False
        runner = scheduler.tp_worker.model_runner
        after = int(scheduler.forward_ct)
        t0 = time.perf_counter()
        try:
            runner.init_decode_cuda_graph()
            _synchronize()
            # read from the graph runner SGLang just built (both releases name its
            # `capture_bs`; only 0.5.23 copies it onto the model runner): one graph per size
            sizes = _shapes.warmed_shapes(runner)[_shapes.DECODE]
        except Exception as exc:
            # Recorded first: raising out of on_idle ends the scheduler, and the orchestrator
            # then reads why from this record and the log.
            seconds = time.perf_counter() - t0
            self.status.update(
                "decode_graph_failed",
                async_decode_graph=_idle_record(after, [], seconds, error=_err(exc)),
            )
            logger.error("coldsnap: idle decode graphs failed after %.3f s: %s", seconds, _err(exc))
            raise
        seconds = time.perf_counter() - t0
        self.status.update(
            "decode_graph_captured", async_decode_graph=_idle_record(after, sizes, seconds)
        )
        logger.info(IDLE_CAPTURE_LOG, len(sizes), ",".join(map(str, sizes)), seconds, after)
        if self.settings.shape_calibration != "off":
            self.calibrate(runner)

    def calibrate(self, runner: Any) -> dict[str, Any]:
        """Calibrates the target's graphs (coldsnap.plugin._shapes) and publishes the record in
        shape-plan.json and the status record's `shape_calibration`. A failure is recorded,
        never raised: raising here would crash SGLang's hook; the orchestrator fails its step
        on a failed record instead (a capture refuses to release, and compensates)."""
        result = _shapes.calibrate(runner)
        record = {"format": SHAPE_PLAN_FORMAT, "kind": SHAPE_PLAN_KIND, **result}
        write_json_atomic(self._runtime_dir() / SHAPE_PLAN_FILE, record)
        if record["outcome"] == "ok":
            self.status.update("shape_calibrated", shape_calibration=record)
        else:
            logger.error("coldsnap: shape calibration failed: %s", record["error"])
            self.status.update("shape_calibration_failed", shape_calibration=record)
        return record

    # ---------------------------------------------------------------- helpers
    def _require_registered(self) -> None:
        if not self.registry.models():
            raise RegistryError(
                "no model storages were registered in this scheduler (the loader hook did not "
                "run), so released weights could not be exported or refilled"
            )

    def _runtime_dir(self) -> Any:
        assert self.settings.runtime_dir is not None  # settings cross-check
        return self.settings.runtime_dir

    def _freed_by(self) -> str:
        return self.adapters[0].freed_by() if self.adapters else "none"


def weight_runners(mgr: Any) -> list[tuple[str, Any]]:
    """(role, runner) of every model runner a weight operation applies to, the way the running
    build names them (contract variant)."""
    if variant_in_use(SELECT_RUNNERS_CONTRACT) == "selector":
        return list(mgr._select_runners("all"))
    runners: list[tuple[str, Any]] = [("target", mgr.tp_worker.model_runner)]
    spec = mgr.draft_worker
    if spec is not None:
        inner = spec.draft_worker  # BaseSpecWorker: its draft worker holds the runners
        if inner is not None:
            runners += [("draft", runner) for runner in inner.draft_runners]
    return runners


IDLE_CAPTURE_LOG = (
    "coldsnap: idle decode graphs captured: graphs=%d batch_sizes=%s seconds=%.3f after_forward=%d"
)
"""The engine log's line for a decode capture at scheduler idle (docs/plugin.md): the number of
decode graphs (one per batch size), the sizes, the capture's seconds, and the scheduler's
forward count when it ran."""


def _idle_record(
    after_forward: int, sizes: list[int], seconds: float, *, error: str | None = None
) -> dict[str, Any]:
    """The status record's `async_decode_graph` once the deferred capture ran."""
    return {
        "outcome": "failed" if error else "ok",
        "error": error,
        "graphs": len(sizes),
        "capture_bs": sizes,
        "seconds": round(seconds, 6),
        "captured_after_forward": after_forward,
        "at": time.time(),
    }


def _synchronize() -> None:
    """Waits for the device, so a capture's seconds hold its last kernels (none without CUDA)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _output(name: str) -> Any:
    """The reply SGLang's scheduler sends back (the HTTP process waits for one)."""
    from sglang.srt.managers import io_struct

    return getattr(io_struct, name)()


def _resume_output() -> Any:
    return _output("ResumeMemoryOccupationReqOutput")


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def export_root(artifact_dir: Path, operation: str | None) -> Path:
    """Each release exports under its own operation id, so one engine can export twice."""
    name = _SAFE.sub("_", operation or "")[:128]
    if not name.strip("."):
        name = "export"  # never "", "." or "..": the root stays inside artifact_dir/native
    return artifact_dir / "native" / name


def live_root(process_artifact_root: Path, operation: str | None) -> Path:
    """Where the disk backing writes the weights of one release (one directory per operation,
    named like its export)."""
    return process_artifact_root / "live" / export_root(process_artifact_root, operation).name


def _reseed(seed: int | None) -> bool:
    """Fresh seeds for Python's, NumPy's and torch's generators (all devices): the plan's, the
    same on every rank, or this rank's own when the plan has none."""
    import random

    import torch

    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**63)
    return True
