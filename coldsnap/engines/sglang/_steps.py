"""The engine role of the machines for SGLang with coldsnap's plugin.

What runs inside the engine (export on release, hydration or recovery on resume, the health
gate) is the plugin's work; each step here asks for it over SGLang's HTTP endpoints and hands
it the files of coldsnap._wire. Each step reads the facts its shared step
(coldsnap.machine.steps) `needs` and returns only facts that step `makes`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from coldsnap._errors import DefinitionError
from coldsnap._wire import (
    CHECKPOINT_SOURCE,
    CUDA_GRAPH,
    KV_CACHE,
    WEIGHTS,
    ProcessStatus,
    ResumePlan,
    StatusError,
    plan_from,
    read_status,
    status_path,
    write_plan,
)
from coldsnap.backends.launch import held_program
from coldsnap.backends.procs import host_pid, running
from coldsnap.engines import EngineClient, EngineError, EnginePolicy
from coldsnap.machine import (
    InstalledBuild,
    Launcher,
    LifecycleRequest,
    Skipped,
    StepContext,
    WeightSource,
)
from coldsnap.machine import steps as s

from ._build import installed_sglang, recorded_sglang
from ._cmdline import SGLangCommandLine, refused_line
from ._keys import hand_over as hand_over_key
from ._keys import headers as key_headers
from ._launcher import export_dir
from ._options import GRAPH_SAVER_ENV
from ._policy import SGLANG_POLICY
from ._ranks import (
    RankReport,
    absent_ranks,
    census,
    extra_ranks,
    rank_names,
    read_ranks,
    scheduler_statuses,
)
from ._specs import SLEEP_RECORD

Identity = Callable[[], InstalledBuild]
"""() -> the engine installed here, by value: what the store binds into capsules."""

_LOG_TAIL_CHARS = 4000
HTTP_PROCESS = "main"  # the HTTP server's status record (coldsnap.plugin._install.process_role)


class SGLangEngine(SGLangCommandLine):
    """Engine steps for SGLang (or any engine that speaks `policy`'s endpoints and the plugin's
    files).

    cuda: the engine runs on GPUs with the memory saver (`--enable-memory-saver`); release_memory
        then requires every scheduler's measurement of the release and refuses when a released
        region is still resident.
    rank_reports: capability `rank_reports`: the plugin in each scheduler reports its rank
        (status records), so release_memory counts the ranks (as many as the request's tp, each
        with this release), and the specs' rank steps run: `ranks_present` before a restored
        tree runs, `tp_barrier` once every rank must have resumed (or started). Each rank's
        record also carries the graph shapes it calibrated, so a capture refuses, before
        releasing, unless every rank published the same ones. An engine that writes no such
        records (the tests' toy engine) leaves it off.
    graphs: capability `cuda_graphs`, which selects the specs' graph steps (destroy_graphs, with
        recapture_graphs as its undo, and the graph tag in resume_rest). Releasing the
        `cuda_graph` tag frees graph memory only when SGLang captures its graphs in the memory
        saver's region (`SGLANG_MEMORY_SAVER_CUDA_GRAPH=1` in the engine's environment), so
        `graphs` requires that and `cuda`; otherwise the graphs (whose addresses stay valid
        across a release and resume of the other regions) stay in the image and no graph step
        runs.
    """

    def __init__(
        self,
        launcher: Launcher,
        *,
        policy: EnginePolicy = SGLANG_POLICY,
        graphs: bool = False,
        cuda: bool = False,
        rank_reports: bool = False,
        name: str = "sglang",
        identity: Identity | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if graphs and not (cuda and _graph_saver(launcher)):
            raise DefinitionError(
                f"SGLangEngine(graphs=True) needs cuda=True and {GRAPH_SAVER_ENV}=1 in the "
                "launcher's environment: without them releasing the cuda_graph tag frees "
                "nothing, and destroy_graphs would claim work it did not do"
            )
        self.name = name
        self.launcher = launcher
        self.policy = policy
        self.graphs = graphs
        self.cuda = cuda
        self.rank_reports = rank_reports
        self.capabilities: frozenset[str] = frozenset(
            name for name, on in (("cuda_graphs", graphs), ("rank_reports", rank_reports)) if on
        )
        self._identity = identity or installed_sglang
        self._transport = transport  # tests hand an httpx.MockTransport

    def build(self, recorded: InstalledBuild | None = None) -> InstalledBuild:
        """The engine installed here (name, version, contract and plugin digests, variants,
        source digests): taken by importing SGLang, or, given a capsule's `recorded` build,
        checked by its source files without importing it (`recorded_sglang`)."""
        if recorded is not None:
            return recorded_sglang(recorded)
        return self._identity()

    def _client(self, ctx: StepContext) -> EngineClient:
        """A client of this operation's engine, carrying its API key where it is keyed."""
        return EngineClient(ctx.facts[s.ENGINE_URL.name], self.policy, transport=self._transport,
                            headers=key_headers(ctx.request))  # fmt: skip

    # -- health and acceptance ----------------------------------------------------------------

    def wait_healthy(self, ctx: StepContext) -> dict[str, Any]:
        """Polls readiness, which answers at once (SGLang's /health sends a one-token request
        and sleeps a whole second before it looks for the answer; the acceptance request that
        follows proves generation). An engine without /ready (SGLang 0.5.17) is polled on /ping,
        which only says that the HTTP server serves, once the plugin's health gate in that
        server has opened again after a release (`_gate_opened`: every rank resumed and the gate
        set the server's status Up itself); otherwise (a first start, whose status only SGLang's
        warm-up makes Up, or an engine without /ping) on /health. Fails at once, with the tail
        of the engine's log, when the engine's process has ended."""
        started = time.monotonic()
        pid = int(ctx.facts[s.ENGINE_PID.name])
        runtime_dir = ctx.facts.get(s.RUNTIME_DIR.name)
        missing: set[str] = set()  # endpoints this engine answers 404
        with self._client(ctx) as client:
            probes = {  # one attempt each: this loop polls every 20 ms on its own
                "ready": lambda: client.ready(once=True),
                "ping": lambda: client.ping(once=True),
                "health": lambda: client.health(once=True),
            }
            while True:
                ctx.check()
                if not running(pid):
                    raise EngineError(
                        "wait_healthy",
                        f"the engine (pid {pid}) ended before it was ready{_log_tail(ctx)}",
                    )
                if "ready" not in missing:
                    probe = "ready"
                elif "ping" not in missing and _gate_opened(runtime_dir, pid):
                    probe = "ping"
                else:
                    probe = "health"
                try:
                    if probes[probe]():
                        break
                except EngineError as exc:  # not serving yet (connection refused), or no route
                    if exc.status == 404:
                        if probe == "health":
                            raise EngineError(
                                "wait_healthy", "the engine answers neither /ready nor /health"
                            ) from exc
                        missing.add(probe)
                        continue  # the next probe asks another endpoint: no need to wait
                time.sleep(0.02)
        return {s.HEALTHY_AFTER_S.name: round(time.monotonic() - started, 3)}

    def record_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        with self._client(ctx) as client:
            return {s.ACCEPTANCE_TOKENS.name: list(client.acceptance_tokens())}

    def check_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        recorded = ctx.facts[s.CAPSULE.name].get(s.ACCEPTANCE_TOKENS.name)
        if not recorded:
            raise EngineError("acceptance", "the capsule records no acceptance tokens to compare")
        with self._client(ctx) as client:
            tokens = client.accept(recorded)
        return {s.ACCEPTANCE_TOKENS.name: list(tokens)}

    # -- capture ------------------------------------------------------------------------------

    def quiesce(self, ctx: StepContext) -> None:
        """Flushes the prefix cache; SGLang refuses (and the step fails) while a request runs."""
        with self._client(ctx) as client:
            client.flush_cache()

    def release_memory(self, ctx: StepContext) -> dict[str, Any]:
        """Releases the KV cache and the weights; an engine started to export writes its
        payload under the runtime directory first (the plugin refuses the release if it
        cannot). Then reads every scheduler's status record: a release the plugin refused
        fails the step; with `rank_reports` there must be exactly the request's tp ranks, each
        reporting this release; on CUDA each scheduler must have measured this release, and a
        region still resident (weights or KV: the memory saver is off, or a tensor lies outside
        its region) fails the step naming the regions and bytes, so nothing resident is sealed.
        Makes the device memory still in use after the release, summed over the schedulers
        (0 without CUDA), and the number of ranks (the capsule carries it)."""
        runtime_dir = Path(ctx.facts[s.RUNTIME_DIR.name])
        started = time.time()
        tp = int(getattr(ctx.request, "tp", None) or 1)
        # a calibration failed, missing or not agreed refuses here, before anything is released
        if self.rank_reports:
            _await_deferred_graphs(runtime_dir, ctx)
        coverage = _shape_coverage(runtime_dir, tp, required=self.rank_reports)
        with self._client(ctx) as client:
            _release_all(client, runtime_dir, tp, ctx.facts[s.ENGINE_PID.name], "release_memory")
        pids = _check_rank_count(runtime_dir, tp, started) if self.rank_reports else {}
        residual = _check_release(runtime_dir, started, cuda=self.cuda)
        return {
            s.EXPORT_DIR.name: str(export_dir(runtime_dir)),
            s.RESIDUAL_DEVICE_BYTES.name: residual,
            s.TP_SIZE.name: tp,
            s.RANK_PIDS.name: pids,
            s.SHAPE_COVERAGE.name: coverage,
        }

    def resume_memory(self, ctx: StepContext) -> None:
        """Undoes release at capture: the weights come back from the model's own checkpoint.
        An engine whose process has ended holds nothing to give back."""
        if not running(int(ctx.facts[s.ENGINE_PID.name])):
            return
        draft = getattr(ctx.request, "draft", None)
        plan = ResumePlan(
            source=CHECKPOINT_SOURCE,
            checkpoint=ctx.request.model.path,
            draft_checkpoint=draft.path if draft is not None else None,
        )
        write_plan(Path(ctx.facts[s.RUNTIME_DIR.name]), plan)
        with self._client(ctx) as client:
            client.resume([WEIGHTS, KV_CACHE])

    def destroy_graphs(self, ctx: StepContext) -> None:
        """Releases the `cuda_graph` region: with SGLANG_MEMORY_SAVER_CUDA_GRAPH=1 (required for
        capability `cuda_graphs`) SGLang captured its graphs inside the memory saver's region,
        so the pages of their memory pool leave the device and the image. The graph
        executables are not destroyed and nothing is captured again: they keep their
        addresses, and resuming the region maps fresh pages there (contents not kept; a
        replay writes what it reads of them), so they replay once it is resumed. Every
        scheduler must have measured this release and freed device memory by it; a release
        that freed nothing (the graphs are not in the region) fails the step, naming the
        ranks, rather than report graphs gone that the image still holds."""
        runtime_dir = Path(ctx.facts[s.RUNTIME_DIR.name])
        started = time.time()
        with self._client(ctx) as client:
            client.release([CUDA_GRAPH])
        _check_graph_release(runtime_dir, started, "destroy_graphs")

    def recapture_graphs(self, ctx: StepContext) -> None:
        """Undoes destroy_graphs on a live engine (an ended one has no graphs to bring back)."""
        if not running(int(ctx.facts[s.ENGINE_PID.name])):
            return
        with self._client(ctx) as client:
            client.resume([CUDA_GRAPH])

    def rehearse_refill(self, ctx: StepContext) -> None:
        """Refills the released engine as a restore of this capsule will, before anything is
        dumped or sealed: the resume plan a restore sends (the payload just exported, which
        the plugin verifies block by block as it reads it, since nothing else has; or the
        model's checkpoint), the weights first and then the rest, as resume_weights and
        resume_rest do. Then the acceptance request, from an empty prefix cache, must give the
        recorded tokens. Either way the engine is released again, the prefix cache flushed
        first (the snapshot holds no cached prefix), and the release checked as
        release_memory's is; it writes no second payload, because the plugin exports only
        from weights the engine did not refill from a payload (a payload refill marks it), and
        an engine that reloads its checkpoint was never started to export. A difference then
        raises EngineError naming the first differing position: every restore would answer
        otherwise, so nothing is sealed, and release_memory's compensation gives the engine
        its checkpoint's weights back."""
        from coldsnap.engines import AcceptanceError  # this method's alone

        runtime_dir = Path(ctx.facts[s.RUNTIME_DIR.name])
        pid = int(ctx.facts[s.ENGINE_PID.name])
        recorded = ctx.facts[s.ACCEPTANCE_TOKENS.name]
        source = WeightSource.from_fact(ctx.facts[s.WEIGHT_SOURCE.name])
        if source.payload:
            payload = ctx.facts.get(s.PAYLOAD_DIR.name)
            if not payload:
                raise EngineError(
                    "rehearse_refill",
                    "the engine was started to export a payload, but no payload was exported "
                    "to refill it from (fact payload_dir)",
                )
            source = WeightSource(source="payload", payload_dir=str(payload), preverified=False)
        self._write_plan(ctx, source.to_fact())
        rest = [KV_CACHE, CUDA_GRAPH] if self.graphs else [KV_CACHE]
        tp = int(getattr(ctx.request, "tp", None) or 1)
        differs: AcceptanceError | None = None
        with self._client(ctx) as client:
            client.resume([WEIGHTS])
            client.resume(rest)
            try:
                client.accept(recorded)
            except AcceptanceError as exc:
                differs = exc
            client.flush_cache_when_idle()
            started = time.time()
            _release_all(client, runtime_dir, tp, pid, "rehearse_refill")
            if self.rank_reports:
                _check_rank_count(runtime_dir, tp, started, step="rehearse_refill")
            try:
                _check_release(runtime_dir, started, cuda=self.cuda)
            except EngineError as exc:
                raise EngineError("rehearse_refill", f"the release again: {exc}") from exc
            if self.graphs:  # as destroy_graphs did, after the weights and the KV cache
                started = time.time()
                client.release([CUDA_GRAPH])
                _check_graph_release(runtime_dir, started, "rehearse_refill")
        if differs is not None:
            where = source.payload_dir if source.payload else f"checkpoint {source.checkpoint}"
            raise EngineError(
                "rehearse_refill",
                f"the engine answers differently after a release and refill (from {where}): "
                "its acceptance token ids differ from those recorded at position "
                f"{differs.first_difference} (recorded {list(differs.expected)}, refilled "
                f"{list(differs.got)}); every restore of this capsule would answer otherwise, so "
                "the capture is refused and nothing is sealed",
            ) from differs

    # -- restore ------------------------------------------------------------------------------

    def resume_weights(self, ctx: StepContext) -> dict[str, Any]:
        """Writes the provider's weight source as the resume plan, with a fresh seed for this
        restore (the same for every rank), then resumes the weights; the plugin hydrates the
        payload or reloads the pinned checkpoint before the call returns. Only a restore hands
        on the stage's `preverified` (its refill is the cold start's critical path, right after
        admission verified the files against the manifest); a wake's engine checks every block
        as it reads it, whatever was verified before."""
        source = dict(ctx.facts[s.WEIGHT_SOURCE.name])
        if isinstance(ctx.request, LifecycleRequest):
            source["preverified"] = False
        else:  # a resumed keyed engine requires this restore's key from now on
            hand_over_key(ctx.request, Path(ctx.facts[s.RUNTIME_DIR.name]))
        seed = self._write_plan(ctx, source)
        with self._client(ctx) as client, self._naming_ranks(ctx, "resume_weights"):
            client.resume([WEIGHTS])
        return {s.RESUME_SEED.name: seed}

    def resume_rest(self, ctx: StepContext) -> None:
        tags = [KV_CACHE, CUDA_GRAPH] if self.graphs else [KV_CACHE]
        with self._client(ctx) as client, self._naming_ranks(ctx, "resume_rest"):
            client.resume(tags)

    # -- sleep and wake (coldsnap.engines.sglang._specs) ---------------------------------------

    def sleep_release(self, ctx: StepContext) -> dict[str, Any]:
        """Releases the KV cache and the weights of a running engine without a snapshot (the
        plugin closes its health gate: requests wait). Then reads every scheduler's status
        record: a rank whose release failed fails the step naming it; with `rank_reports` there
        must be exactly the captured number of ranks, each reporting this release. Makes the
        sleep record: per rank the host bytes returned to the kernel and the device bytes
        measured freed (None where none was measured), and whether health answered while
        asleep."""
        runtime_dir = Path(ctx.facts[s.RUNTIME_DIR.name])
        capsule = ctx.facts.get(s.CAPSULE.name) or {}
        tp = int(capsule.get(s.TP_SIZE.name) or 1)
        started = time.time()
        with self._client(ctx) as client:
            _release_all(client, runtime_dir, tp, ctx.facts[s.ENGINE_PID.name], "release")
            if self.rank_reports:
                _check_rank_count(runtime_dir, tp, started, step="release")
            ranks = _sleep_report(runtime_dir, started)
            try:
                healthy: bool | None = client.health(once=True)
            except EngineError:
                healthy = None  # neither 200 nor 503: reported as unknown
        record = {
            "at": started,
            "ranks": ranks,
            "host_bytes": sum(r["host_bytes"] for r in ranks.values()),
            "device_freed": _sum_measured(r["device_freed"] for r in ranks.values()),
            "exported": any(r["exported"] for r in ranks.values()),
            "healthy_while_asleep": healthy,
        }
        return {SLEEP_RECORD.name: record}

    def wake_in_place(self, ctx: StepContext) -> Skipped | None:
        """Undoes a sleep's release: resumes whatever is still released, the weights refilled
        from the weight source the engine was restored from, verified again as they are read
        (never `preverified`: the files may have changed since). An engine whose process has
        ended holds nothing to give back."""
        if not running(int(ctx.facts[s.ENGINE_PID.name])):
            return Skipped("the engine's process has ended: nothing to resume")
        released = _released_tags(ctx, "wake_in_place")
        if not released:
            return Skipped("the engine reports nothing released")
        if WEIGHTS in released:
            source = ctx.facts.get(s.WEIGHT_SOURCE.name)
            if not isinstance(source, dict):
                raise EngineError(
                    "wake_in_place",
                    "the target's receipt names no weight source to refill the weights from",
                )
            self._write_plan(ctx, {**source, "preverified": False})
        with self._client(ctx) as client, self._naming_ranks(ctx, "wake_in_place"):
            for tag in (WEIGHTS, KV_CACHE):  # the weights first: KV is sized from them
                if tag in released:
                    client.resume([tag])
        return None

    def sleep_again(self, ctx: StepContext) -> Skipped | None:
        """Undoes a wake's resume: releases again what the wake resumed, so that the engine is
        left asleep (as it was before the wake) rather than half awake. An engine whose
        process has ended holds nothing to release."""
        if not running(int(ctx.facts[s.ENGINE_PID.name])):
            return Skipped("the engine's process has ended: nothing to release")
        released = _released_tags(ctx, "sleep_again")
        tags = [t for t in (KV_CACHE, WEIGHTS) if t not in released]
        if not tags:
            return Skipped("the engine reports the weights and the KV cache released already")
        with self._client(ctx) as client, self._naming_ranks(ctx, "sleep_again"):
            client.release(tags)
        return None

    def _write_plan(self, ctx: StepContext, source: dict[str, Any]) -> int:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        plan = plan_from({**source, "seed": seed}, where=f"weight source {source!r}")
        write_plan(Path(ctx.facts[s.RUNTIME_DIR.name]), plan)
        return seed

    # -- ranks --------------------------------------------------------------------------------

    def check_ranks(self, ctx: StepContext) -> None:
        """Before a restored tree runs: every rank the capsule was captured with is back, a
        live process of this engine at the pid the capsule carries (CRIU restores pids).
        Raises EngineError naming each rank that is not."""
        capsule = ctx.facts[s.CAPSULE.name]
        tp = _captured_tp(ctx, "ranks_present")
        problems = absent_ranks(
            ctx.facts[s.ENGINE_PID.name], capsule.get(s.RANK_PIDS.name) or {}, tp
        )
        if problems:
            raise EngineError(
                "ranks_present",
                f"the restored engine lacks ranks of its {tp}: " + "; ".join(problems),
            )

    def tp_barrier(self, ctx: StepContext) -> dict[str, Any]:
        """Reads what every rank reported (see coldsnap.machine.steps.TP_BARRIER); raises
        EngineError naming each rank that is missing, failed, ended, or out of step."""
        runtime_dir, tp = Path(ctx.facts[s.RUNTIME_DIR.name]), _captured_tp(ctx, "tp_barrier")
        found, problems = read_ranks("tp_barrier", runtime_dir, tp, ctx.facts[s.ENGINE_PID.name])
        hydrated = WeightSource.from_fact(ctx.facts[s.WEIGHT_SOURCE.name]).payload
        for r in found:
            why = _rank_problem(r, hydrated=hydrated)
            if why:
                problems.append(f"{r.describe()}: {why}")
        operations = {r.status.operation for r in found}
        if len(operations) > 1:
            problems.append(
                "the ranks are at different operations: "
                + ", ".join(f"rank {r.rank} {r.status.operation}" for r in found)
            )
        if problems:
            raise EngineError(
                "tp_barrier", f"{len(problems)} of {tp} ranks: " + "; ".join(problems)
            )
        ranks = {
            r.name: {
                "pid": r.pid,
                "operation": r.status.operation,
                "event": r.last_event,
                "nccl": r.status.resume.nccl if r.status.resume is not None else None,
            }
            for r in found
        }
        return {s.TP_RANKS.name: ranks}

    @contextlib.contextmanager
    def _naming_ranks(self, ctx: StepContext, step: str) -> Iterator[None]:
        """A failed call to a multi-rank engine says which ranks have ended."""
        try:
            yield
        except EngineError as exc:
            if not self.rank_reports:
                raise
            capsule = ctx.facts.get(s.CAPSULE.name) or {}
            named = census(
                ctx.facts.get(s.RUNTIME_DIR.name),
                int(capsule.get(s.TP_SIZE.name) or 0),
                ctx.facts.get(s.ENGINE_PID.name),
                capsule.get(s.RANK_PIDS.name),
            )
            raise EngineError(step, f"{exc}{named}") from exc


def _captured_tp(ctx: StepContext, step: str) -> int:
    """The ranks the capsule was captured with (its carried tp_size)."""
    tp = (ctx.facts.get(s.CAPSULE.name) or {}).get(s.TP_SIZE.name)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise EngineError(step, f"the capsule records no tensor-parallel size (tp_size: {tp!r})")
    return tp


def _rank_problem(report: RankReport, *, hydrated: bool) -> str | None:
    """Why one rank is not ready to serve, or None."""
    status = report.status
    if not report.running:
        return "its process is not running"
    if status.outcome not in (None, "ok"):
        return f"{status.outcome} at {report.last_event}: {status.error}"
    if status.released_tags:
        return f"still released: {', '.join(status.released_tags)}"
    calibration = status.shape_calibration
    if calibration is not None and calibration.get("outcome") != "ok":
        return f"its graph shapes are not the plan: {calibration.get('error')}"
    if hydrated and status.mode == "restore" and not status.startup_hydration:
        return "built from the payload but reported no hydration"
    if not status.registered:
        return "registered no model storages"
    return None


def _check_rank_count(
    runtime_dir: Path, tp: int, started: float, *, step: str = "release_memory"
) -> dict[str, int | None]:
    """Exactly `tp` scheduler ranks, each reporting a release that began after `started`;
    returns each rank's pid. EngineError of `step` naming each rank that is not."""
    found, problems = read_ranks(step, runtime_dir, tp, None)
    for r in found:
        if not any(e.event == "released" and e.time >= started for e in r.status.events):
            problems.append(f"{r.describe()} did not report this release")
    extra = extra_ranks(runtime_dir, tp)
    if extra:
        problems.append(f"the engine has more ranks than the request's tp {tp}: {', '.join(extra)}")
    if problems:
        raise EngineError(step, "; ".join(problems))
    return {r.name: r.pid for r in found}


def _sleep_report(runtime_dir: Path, since: float) -> dict[str, dict[str, Any]]:
    """Per scheduler, what its status record says this release freed: `host_bytes` (weight
    pages returned to the kernel, the CPU backend), `device_freed` (device bytes measured freed
    on CUDA; None where none was measured) and `exported` (whether the plugin also wrote a
    payload, as an engine started to export does). EngineError naming a scheduler whose
    release failed."""
    out: dict[str, dict[str, Any]] = {}
    for name, status in scheduler_records(runtime_dir, "release").items():
        if status.outcome == "failed":
            raise EngineError("release", f"{name}: the plugin refused: {status.error}")
        host, exported = 0, False
        for event in status.events:
            if event.event == "released" and event.time >= since:
                host += int(event.fields.get("discarded_bytes") or 0)
                exported = exported or bool(event.fields.get("export"))
        report = status.cuda_release
        freed = report.device_freed if report is not None and report.at >= since else None
        out[name] = {
            "pid": status.pid,
            "host_bytes": host,
            "device_freed": None if freed is None else int(freed),
            "exported": exported,
        }
    return out


def _sum_measured(values: Iterable[int | None]) -> int | None:
    """The sum of the measured values; None when none was measured."""
    measured = [v for v in values if v is not None]
    return sum(measured) if measured else None


def _released_tags(ctx: StepContext, step: str) -> set[str]:
    """The regions the engine's HTTP server reports released (its gate's status record,
    coldsnap.plugin._gate), written by the engine's own process, once no release or resume is
    in flight (an orchestrator that died mid-call leaves one running in the engine: its end
    is waited for, up to the step's deadline). EngineError of `step` when the record is
    absent or another process's: what to release or resume is then unknown."""
    path = status_path(Path(ctx.facts[s.RUNTIME_DIR.name]), HTTP_PROCESS)
    pid = int(ctx.facts[s.ENGINE_PID.name])
    while True:
        try:
            status = read_status(path)
        except (OSError, StatusError) as exc:
            raise EngineError(step, f"the engine's status record: {exc}") from None
        if not _engine_wrote(status.pid, pid):
            raise EngineError(step, f"{path} was written by pid {status.pid}, not {pid}")
        if status.last_event != "gate_closed":  # a call in flight closes the gate first
            return set(status.released_tags or ())
        ctx.check()
        time.sleep(0.05)


def _graph_saver(launcher: Launcher) -> bool:
    env = getattr(launcher, "base_env", None) or {}
    return env.get(GRAPH_SAVER_ENV) == "1"


def scheduler_records(
    runtime_dir: Path, step: str = "release_memory"
) -> dict[str, ProcessStatus]:
    """process name -> the typed status record (coldsnap._wire.ProcessStatus) of every
    scheduler (one per TP rank); EngineError of `step` naming a record that cannot be read or
    is not the plugin's, and the field."""
    return scheduler_statuses(runtime_dir, step)


def _release_all(client: EngineClient, runtime_dir: Path, tp: int, pid: int, step: str) -> None:
    """Releases the KV cache and the weights; a refusal says, beside the engine's answer, which
    ranks reported what (the census), as step `step`."""
    try:
        client.release([KV_CACHE, WEIGHTS])
    except EngineError as exc:
        raise EngineError(step, f"{exc}{census(runtime_dir, tp, pid)}") from exc


def _await_deferred_graphs(runtime_dir: Path, ctx: StepContext) -> None:
    """Waits, within the step's deadline, until no scheduler reports its decode graphs
    deferred. A rank started with `async_cuda_graphs` captures them, and then calibrates, at
    its first idle boundary after a completed request, which may come just after the requests
    before the release were answered; reading the calibration before then would find none.
    EngineError naming the ranks still pending when the deadline comes (nothing released)."""
    while True:
        pending = sorted(
            name
            for name, status in scheduler_records(runtime_dir).items()
            if status.async_decode_graph == "pending"
        )
        if not pending:
            return
        if ctx.remaining() <= 0.1:
            raise EngineError(
                "release_memory",
                f"the decode graphs of {', '.join(pending)} are still deferred (they are captured "
                "and calibrated at the first idle boundary after a completed request)",
            )
        ctx.check()  # cancelled
        time.sleep(0.05)


def _shape_coverage(runtime_dir: Path, tp: int, *, required: bool) -> dict[str, Any] | None:
    """The graph shapes the schedulers published (coldsnap.plugin._shapes), the same on every
    rank, or None when none published any and none was `required`.

    `required` (an engine whose plugin runs in every scheduler, `rank_reports`): each of the
    request's `tp` ranks must have published one, since a capture always asks for them
    (coldsnap_env) and a capsule sealed without them would bind no shapes at all. Raises
    EngineError naming each rank whose calibration failed (its plan unrecognised, or its
    warmed shapes not the plan), each rank that published none while it was required or
    while others did, and, when the ranks disagree, which ranks published which shapes."""
    records = scheduler_records(runtime_dir)
    names = rank_names(tp) if required else sorted(records)
    published: dict[str, Any] = {}
    failed: list[str] = []
    silent: list[str] = []
    for name in names:
        status = records.get(name)
        calibration = status.shape_calibration if status is not None else None
        if calibration is None:
            silent.append(name if status is not None else f"{name} (no status record)")
        elif calibration.get("outcome") != "ok":
            failed.append(f"{name}: {calibration.get('error')}")
        elif calibration.get("coverage") is None:
            failed.append(f"{name}: its calibration record holds no coverage")
        else:
            published[name] = calibration["coverage"]
    if failed:
        raise EngineError("release_memory", "shape calibration failed: " + "; ".join(failed))
    if silent and (required or published):
        raise EngineError(
            "release_memory",
            f"no shape calibration published by {', '.join(silent)}: the capsule would bind no "
            "graph shapes for it, so nothing is released or sealed",
        )
    by_shapes: dict[str, list[str]] = {}
    for name, coverage in published.items():
        by_shapes.setdefault(json.dumps(coverage, sort_keys=True), []).append(name)
    if len(by_shapes) > 1:
        parts = [f"{' and '.join(ranks)}: {shapes}" for shapes, ranks in by_shapes.items()]
        raise EngineError(
            "release_memory", "the ranks published different graph shapes: " + "; ".join(parts)
        )
    return next(iter(published.values()), None)


def _check_release(runtime_dir: Path, started: float, *, cuda: bool) -> int:
    """The device bytes still in use after the release, summed over the schedulers; raises
    EngineError naming each scheduler whose release failed, was not measured, or left a
    released region resident."""
    records = scheduler_records(runtime_dir)
    if not records:
        if cuda:
            raise EngineError(
                "release_memory",
                f"no scheduler status record under {runtime_dir / 'sglang'}: the plugin did not "
                "measure the release, so device memory may still hold weights or KV cache",
            )
        return 0
    problems: list[str] = []
    residual = 0
    for name, status in records.items():
        if status.outcome == "failed":
            problems.append(f"{name}: the plugin refused the release: {status.error}")
            continue
        report = status.cuda_release
        if report is None or report.at < started:
            if cuda:
                problems.append(f"{name}: no measurement of this release in its status record")
            continue
        if report.error:
            problems.append(f"{name}: the release could not be measured: {report.error}")
            continue
        if cuda and report.device == "cpu":
            problems.append(f"{name}: measured on cpu, but this engine runs on CUDA")
            continue
        if report.resident:
            parts = ", ".join(
                f"{tag} {_gib(n)} of {_gib(report.regions.get(tag, {}).get('bytes', n))}"
                for tag, n in sorted(report.resident.items())
            )
            problems.append(
                f"{name} ({report.device}): still resident after the release: {parts} "
                f"(device memory in use {_gib(report.device_used_after or 0)}, freed "
                f"{_gib(report.device_freed or 0)})"
            )
            continue
        residual += int(report.residual_device_bytes or 0)
    if problems:
        hint = (
            "; start SGLang with --enable-memory-saver (engine option live_backing discard or "
            "disk), or the capture would seal weights and KV into the image"
            if cuda
            else ""
        )
        raise EngineError("release_memory", "; ".join(problems) + hint)
    return residual


def _check_graph_release(runtime_dir: Path, started: float, step: str) -> int:
    """The device bytes that releasing the `cuda_graph` region freed, summed over the
    schedulers (each one's own measurement: in use before SGLang's release minus in use right
    after it, before any cache was emptied). The region holds no tensor whose mapping could be
    checked, so freed memory is the evidence: EngineError of `step` naming each scheduler whose
    release failed, was not measured, or freed nothing."""
    records = scheduler_records(runtime_dir, step)
    if not records:
        raise EngineError(
            step, f"no scheduler status record under {runtime_dir / 'sglang'}: nothing measured "
            "whether releasing the cuda_graph region freed the graphs' memory",
        )  # fmt: skip
    problems: list[str] = []
    freed = 0
    for name, status in records.items():
        report = status.cuda_release
        if status.outcome == "failed":
            problems.append(f"{name}: the plugin refused the release: {status.error}")
        elif report is None or report.at < started or CUDA_GRAPH not in report.tags:
            problems.append(f"{name}: no measurement of this release of the cuda_graph region")
        elif report.error:
            problems.append(f"{name}: the release could not be measured: {report.error}")
        elif report.device_used_before is None or report.device_used_released is None:
            problems.append(f"{name}: the device memory around the release was not measured")
        elif report.device_used_before - report.device_used_released <= 0:
            problems.append(
                f"{name} ({report.device}): releasing the cuda_graph region freed no device "
                f"memory (in use {_gib(report.device_used_before)} before, "
                f"{_gib(report.device_used_released)} after): the graphs were not captured in "
                "the memory saver's region, so the image would still hold them"
            )
        else:
            freed += report.device_used_before - report.device_used_released
    if problems:
        raise EngineError(step, "; ".join(problems))
    return freed


def _gate_opened(runtime_dir: str | None, pid: int) -> bool:
    """Whether the plugin's health gate in the engine's HTTP server has opened again after a
    release, by that server's own status record (coldsnap.plugin._gate): open, nothing left
    released, written by the engine's process `pid` (n610 restores keep PIDs). The gate opens
    only once every released region was resumed and every rank reported its resume (hydration
    included), and it sets the server's status Up as it opens: what /health would wait for,
    minus its one-token request. A record that is absent, unreadable or another process's is
    no evidence, and the caller asks /health instead (slower, never less strict)."""
    if not runtime_dir:
        return False
    try:
        status = read_status(status_path(Path(runtime_dir), HTTP_PROCESS))
    except (OSError, StatusError):
        return False
    return _engine_wrote(status.pid, pid) and status.gate == "open" and status.released_tags == ()


def _engine_wrote(writer: int, engine_pid: int) -> bool:
    """Whether a status record's writer (a PID in the engine's own namespace) is the engine's
    HTTP server: the root of its tree, or the program a launch holder at that root runs (the
    driver may start the engine under a small holder: coldsnap.backends.launch)."""
    pid = host_pid(engine_pid, writer)
    return pid == engine_pid or pid == held_program(engine_pid)


def _gib(n: int) -> str:
    return f"{n} B ({n / 2**30:.3f} GiB)"


def _log_tail(ctx: StepContext) -> str:
    path = ctx.facts.get(s.ENGINE_LOG.name)
    if not path:
        return " (no engine log recorded)"
    try:
        tail = Path(path).read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    except OSError as exc:
        return f"; its log {path} cannot be read: {exc}"
    if (refused := refused_line(tail)) is not None:
        return f": it refused its command line: {refused} (its log: {path})"
    return f"; the tail of its log {path}:\n{tail}"


__all__ = ["GRAPH_SAVER_ENV", "Identity", "SGLangEngine", "installed_sglang"]
