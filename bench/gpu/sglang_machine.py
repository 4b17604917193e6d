"""Real SGLang 0.5.17 through `Machine` on the H200: {n610, n580} x {native, recovery}, each
restore compared token for token with a cold start of the same server (bench only, not the
product).

    python3 bench/gpu/sglang_machine.py --out OUT --model /tmp/model [--size small]
        [--variants n610-native,...] [--restores 2] [--budget 540] [--cold-json PATH]
        [--refusal] [--dry] [--mem-frac 0.05] [--naive] [--warm-cold] [--cli-restores N]
        [--extra-args "ENGINE FLAGS"]

Order (a fresh machine compiles SGLang's JIT kernels on first use, about 100 s, so the cold start
runs first, and once): the pinned host-to-device reference copy; a cold start of the server the
capture launches (the launcher's own command line: SGLang with coldsnap's plugin, the memory
saver) timed to its first answer, then its answers to every prompt (prefix cache flushed before
each), then stopped; per variant (n610-native first, so a call that runs out of time still
brings it back): a capture through `Machine.for_request(CaptureRequest(...))`, and `--restores`
restores through `Machine.for_request(RestoreRequest(...))`, each timed from the call to its
first answer and then compared with the cold answers on every prompt. `--refusal` adds (if time
is left) a capture of a server without the memory saver, which must fail at release_memory
naming the resident regions. `--cold-json PATH` keeps the cold start's record (answers and time
to first answer) in PATH and reuses it when PATH already holds one for the same model and engine
arguments: a later call on the same machine qualifies more variants against the same cold run.
Results go to OUT/sglang_machine.json after every phase; engine
logs stay in each operation's workdir (copied to OUT/logs at the end). `--dry` checks imports,
arguments and requests without a GPU and launches nothing. `--naive` snapshots the cold server
whole (nothing released: CUDA checkpoint and CRIU dump of the serving tree), restores it and
times it to its first answer: issue 17's naive baseline. `--warm-cold` launches the cold server
once more at the end (JIT kernels compiled by then: the fair cold start for a host that already
ran the server). `--cli-restores N` restores each capsule N more times by `coldsnap restore` in a
new process (the operator's path: interpreter, command line, Machine, restore), timed from the
spawn to the first answer, and prints its ratio to the in-process restores' median
(`cli_vs_in_process`). A variant may add engine options after a dot (`n610-native.graphs`:
CUDA graphs in the memory saver's region, OPTIONS); `--extra-args` adds engine flags to every
server of the run, cold starts included, so its ratios compare like with like. Per-process
device memory (nvidia-smi) is recorded after each release.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from coldsnap.backends import reap_children  # noqa: E402 (the repository goes on the path first)
from coldsnap.backends.procs import kill_tree  # noqa: E402

BASE_ARGS = (
    "--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
    "--cuda-graph-max-bs", "8",
)  # fmt: skip
ENGINE_ARGS = (*BASE_ARGS, "--mem-fraction-static", "0.05")  # replaced by --mem-frac in main()
VARIANTS = ("n610-native", "n610-recovery", "n580-native", "n580-recovery")
# A variant may name engine options after a dot: "n610-native.graphs" captures and restores with
# SGLang's CUDA graphs in the memory saver's region (prefill graphs off), compared with the same
# cold start as the others.
OPTIONS: dict[str, dict[str, str]] = {"graphs": {"cuda_graphs_in_saver": "1"}}


def split_variant(variant: str) -> tuple[str, str, dict[str, str] | None]:
    """(driver, provider, engine options or None) of a variant's name."""
    base, _, option = variant.partition(".")
    driver, provider = base.split("-", 1)
    return driver, provider, (dict(OPTIONS[option]) if option else None)


NEW_TOKENS = 16
GIB = 2**30


def coldsnap_digest() -> str:
    """The coldsnap under test (its plugin runs in the cold server too): a cold start kept by an
    earlier call is reused only for the same source."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((REPO / "coldsnap").rglob("*.py")):
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _prompt(seed: int, n: int) -> list[int]:
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % 990)
    return out


# Distinct prompts (vocab 1000 of the random Llama); the prefix cache is flushed before each.
PROMPTS = {f"P{i}": _prompt(1000 + 17 * i, 18 + 5 * i) for i in range(1, 5)}


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.root = Path(args.root)
        self.t0 = time.monotonic()
        self.results: dict[str, Any] = {
            "size": args.size,
            "engine_args": list(ENGINE_ARGS),
            "prompts": PROMPTS,
            "new_tokens": NEW_TOKENS,
            "variants": {},
            "log": [],
        }

    # -- bookkeeping ---------------------------------------------------------------------------
    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def log(self, *parts: Any) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] " + " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.results["log"].append(line)

    def save(self) -> None:
        path = self.out / "sglang_machine.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(path)

    # -- requests ------------------------------------------------------------------------------
    def model_ref(self) -> Any:
        from coldsnap import ModelRef

        return ModelRef(
            id=f"llama-{self.args.size}-random", revision="seed0", path=str(self.args.model)
        )

    def capture_request(self, variant: str, *, engine: str = "sglang") -> Any:
        from coldsnap import CaptureRequest

        driver, provider, options = split_variant(variant)
        (self.root / variant).mkdir(parents=True, exist_ok=True)
        return CaptureRequest(
            driver=driver, provider=provider, engine=engine, model=self.model_ref(),
            workdir=str(self.root / variant / "capture"), store=str(self.root / "store"),
            name=variant, engine_args=ENGINE_ARGS, engine_options=options or {},
        )  # fmt: skip

    def restore_request(self, variant: str, i: int) -> Any:
        from coldsnap import RestoreRequest

        driver, provider, options = split_variant(variant)
        (self.root / variant).mkdir(parents=True, exist_ok=True)
        return RestoreRequest(
            driver=driver, provider=provider, engine="sglang", artifact=variant,
            model=self.model_ref(), workdir=str(self.root / variant / f"restore{i}"),
            store=str(self.root / "store"), engine_args=ENGINE_ARGS, engine_options=options or {},
        )  # fmt: skip

    # -- HTTP ----------------------------------------------------------------------------------
    def generate(self, url: str, ids: list[int], timeout: float = 60.0) -> list[int]:
        import httpx

        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
        }
        r = httpx.post(f"{url}/generate", json=body, timeout=timeout)
        if r.status_code != 200:
            raise RuntimeError(f"/generate: HTTP {r.status_code}: {r.text[:500]}")
        return [int(t) for t in r.json()["output_ids"]]

    def flush(self, url: str) -> None:
        import httpx

        r = httpx.post(f"{url}/flush_cache", timeout=60.0)
        if r.status_code != 200:
            raise RuntimeError(f"/flush_cache: HTTP {r.status_code}: {r.text[:500]}")

    def answers(self, url: str) -> dict[str, list[int]]:
        out = {}
        for name, ids in PROMPTS.items():
            self.flush(url)
            out[name] = self.generate(url, ids)
        return out

    # -- phases --------------------------------------------------------------------------------
    def pinned_reference(self) -> dict[str, Any]:
        """Pinned host-to-device copy of 1 GiB, buffers allocated once (the bus's speed), in a
        child process: this one holds no CUDA context, so device memory measured device-wide
        is the servers' alone."""
        code = "import json, sglang_machine as m; print(json.dumps(m.pinned_copy()))"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            cwd=str(Path(__file__).parent), timeout=120,
        ).stdout  # fmt: skip
        return json.loads(out.strip().splitlines()[-1])

    def cold_start(self) -> dict[str, Any]:
        """The capture's own launch command (native: the same flags and plugin; the export only
        acts at release), timed from the launch to its first answer; then every prompt. With
        --naive, that server is then snapshotted whole (`naive`) instead of stopped."""
        from coldsnap.backends import launch
        from coldsnap.engines.sglang import build
        from coldsnap.machine import WeightSource

        request = self.capture_request("n610-native")
        engine = build(request)
        workdir = self.root / "cold"
        workdir.mkdir(parents=True, exist_ok=True)
        command = engine.launcher.command(request, workdir, weights=WeightSource(source="payload"))
        t0 = time.perf_counter()
        launched = launch(
            command.argv, log_path=workdir / "engine.log", env={**os.environ, **command.env},
            cwd=str(workdir),
        )  # fmt: skip
        rec: dict[str, Any] = {"argv": command.argv, "log": str(workdir / "engine.log")}
        stopped = False
        try:
            first = None
            while first is None:
                if launched.poll() is not None:
                    raise RuntimeError("the cold server ended")
                if self.left() < 30 or time.perf_counter() - t0 > self.args.cold_s:
                    raise RuntimeError("the cold server did not answer in time")
                try:  # the first answer may wait for kernels compiled on first use
                    first = self.generate(command.url, PROMPTS["P1"], timeout=300.0)
                except Exception:
                    time.sleep(0.5)
            rec["first_answer_s"] = round(time.perf_counter() - t0, 3)
            rec["answers"] = self.answers(command.url)
            rec["gpu_apps"] = gpu_apps()
            if self.args.naive:
                stopped = True  # the dump ends the tree; naive() stops what it restores
                self.results["naive"] = self.naive(launched.pid, command.url, rec["answers"])
        finally:
            if not stopped:
                kill_tree(launched.pid)
        return rec

    def naive(self, pid: int, url: str, cold: dict[str, list[int]]) -> dict[str, Any]:
        """The baseline issue 17 names: the whole serving tree snapshotted as it runs (weights,
        KV cache and all: nothing released), CUDA state through the driver's checkpoint API and
        the process tree through CRIU, then restored and timed to its first answer."""
        from coldsnap.backends import Criu, CudaCheckpoint
        from coldsnap.backends.procs import tree_pids

        rec: dict[str, Any] = {}
        images = self.root / "naive-images"
        criu, cuda = Criu(), CudaCheckpoint()
        pids = tree_pids(pid)
        try:
            t = time.perf_counter()
            cuda_pids = cuda.lock_all(pids, 60.0)
            rec["cuda_lock_s"] = round(time.perf_counter() - t, 3)
            t = time.perf_counter()
            cuda.checkpoint_all(cuda_pids, 600.0)
            rec["cuda_checkpoint_s"] = round(time.perf_counter() - t, 3)
            rec["cuda_pids"] = cuda_pids
            t = time.perf_counter()
            manifest = criu.dump(pid, images)
            rec["criu_dump_s"] = round(time.perf_counter() - t, 3)
            rec["image_bytes"] = manifest.image_bytes
            reap_children()  # the dumped tree's zombies would hold the PIDs CRIU restores
            self.log("naive: dumped", rec)
            t0 = time.perf_counter()
            tree = criu.restore(images, detached=True)
            rec["criu_restore_s"] = round(time.perf_counter() - t0, 3)
            t = time.perf_counter()
            cuda.restore_all(cuda_pids)
            rec["cuda_restore_unlock_s"] = round(time.perf_counter() - t, 3)
            first = self.generate(url, PROMPTS["P1"], timeout=120.0)
            rec["first_answer_s"] = round(time.perf_counter() - t0, 3)
            got = {"P1": first, **{k: v for k, v in self.answers(url).items() if k != "P1"}}
            rec["equal"] = {k: got[k] == cold.get(k) for k in PROMPTS}
            self.log("naive: restored", rec)
            kill_tree(tree.pid)
        except Exception:
            rec["error"] = traceback.format_exc()
            self.log("naive failed", rec["error"])
            kill_tree(pid)
        finally:
            shutil.rmtree(images, ignore_errors=True)
        return rec

    def cold_once(self) -> dict[str, Any]:
        """The cold start, or the one an earlier call on this machine kept in --cold-json."""
        path = self.args.cold_json
        key = {"model": str(self.args.model), "size": self.args.size,
               "engine_args": list(ENGINE_ARGS), "prompts": PROMPTS,
               "coldsnap": coldsnap_digest(),
               "launch": list(self.capture_request("n610-native").engine_args)}  # fmt: skip
        if path is not None and path.exists():
            kept = json.loads(path.read_text())
            if kept.get("key") == key:
                return {**kept["cold"], "reused_from": str(path)}
        cold = self.cold_start()
        if path is not None:
            path.write_text(json.dumps({"key": key, "cold": cold}, default=str))
        return cold

    def capture(self, variant: str) -> dict[str, Any]:
        from coldsnap import Machine

        request = self.capture_request(variant)
        machine = Machine.for_request(request, subscribers=[self._event])
        t0 = time.perf_counter()
        receipt = machine.capture(request)
        rec = _receipt(receipt, time.perf_counter() - t0)
        facts = receipt.facts
        for key in ("image_bytes", "residual_device_bytes", "capsule_bytes", "payload_bytes"):
            rec[key] = facts.get(key)
        return rec

    def restore(self, variant: str, i: int, cold: dict[str, list[int]] | None) -> dict[str, Any]:
        from coldsnap import Machine

        request = self.restore_request(variant, i)
        machine = Machine.for_request(request, subscribers=[self._event])
        t0 = time.perf_counter()
        receipt = machine.restore(request)
        rec = _receipt(receipt, time.perf_counter() - t0)
        rec["verify_image_seconds"] = receipt.facts.get("verify_image_seconds")
        if not receipt.ok:
            return rec
        try:
            got = self.first_and_answers(receipt.facts["engine_url"], t0, cold, rec)
            rec["answers"] = got
            if cold is not None:
                rec["first_answer_equal"] = got["P1"] == cold.get("P1")
            rec["hydration"] = self.hydration(receipt)
        except Exception as exc:
            rec["answer_error"] = f"{type(exc).__name__}: {exc}"
        finally:
            machine.stop(receipt)
        return rec

    def first_and_answers(
        self, url: str, t0: float, cold: dict[str, list[int]] | None, rec: dict[str, Any]
    ) -> dict[str, list[int]]:
        """The first answer timed from t0 into rec, then every prompt (cache flushed before
        each) compared with the cold start's; returns the answers."""
        self.flush(url)
        first = self.generate(url, PROMPTS["P1"])
        rec["first_answer_s"] = round(time.perf_counter() - t0, 3)
        got = {"P1": first, **{k: v for k, v in self.answers(url).items() if k != "P1"}}
        if cold is not None:
            rec["equal"] = {k: got[k] == cold.get(k) for k in PROMPTS}
        return got

    def fresh_restore(self, variant: str, cold: dict[str, list[int]] | None) -> dict[str, Any]:
        """A restore by a new orchestrator process (what `coldsnap restore` does, without its
        CLI's libraries), timed from starting that process to the first answer: the imports a
        cold orchestrator pays are in it."""
        argv = [
            sys.executable, __file__, "--out", str(self.out / "fresh"), "--model",
            str(self.args.model), "--size", self.args.size, "--root", str(self.root),
            "--mem-frac", self.args.mem_frac, "--extra-args", self.args.extra_args,
            "--child-restore", variant,
        ]  # fmt: skip
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        child_s = time.perf_counter() - t0
        rec: dict[str, Any] = {"child_s": round(child_s, 3), "rc": done.returncode}
        try:
            rec.update(json.loads(done.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            rec["error"] = (done.stdout + done.stderr)[-3000:]
            return rec
        url, pid = rec.get("engine_url"), rec.get("engine_pid")
        if rec.get("outcome") != "done" or not url:
            return rec
        try:
            self.first_and_answers(url, t0, cold, rec)
        finally:
            if pid:
                kill_tree(int(pid))
        return rec

    def cli_restore(
        self, variant: str, i: int, cold: dict[str, list[int]] | None
    ) -> dict[str, Any]:
        """`coldsnap restore` as an operator runs it (a new process: the command line, its
        imports, the Machine, the restore), timed from the spawn to the first answer, then every
        prompt compared with the cold start; stopped with `coldsnap stop`. The in-process restores
        above are the baseline it is compared with (summary: `cli_vs_in_process`)."""
        from coldsnap.engines.sglang import free_port

        port = free_port()
        name = f"{self.args.size}-{variant}-{i}"  # names serve host-wide: one per run
        cli = [sys.executable, "-m", "coldsnap.cli"]
        argv = [
            *cli, "restore", variant, "--store", str(self.root / "store"), "--port", str(port),
            "--workdir", str(self.root / variant / f"cli{i}"), "--serve-as", name,
            "--model-path", str(self.args.model), "--json",
        ]  # fmt: skip
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        rec: dict[str, Any] = {
            "command_s": round(time.perf_counter() - t0, 3),
            "rc": done.returncode,
        }
        events = []
        for line in done.stdout.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        finished = [e for e in events if e.get("event") == "finished"]
        if finished:  # the receipt's own seconds: the time inside Machine.restore
            rec["receipt_s"] = finished[-1].get("seconds")
            rec["result"] = finished[-1].get("result")
        rec["steps"] = {
            e["step"]: e.get("seconds")
            for e in events
            if e.get("event") == "step_ended" and e.get("status") == "done"
        }
        if done.returncode != 0:
            rec["error"] = (done.stdout + done.stderr)[-3000:]
            return rec
        url = f"http://127.0.0.1:{port}"
        try:
            self.first_and_answers(url, t0, cold, rec)
        except Exception as exc:
            rec["answer_error"] = f"{type(exc).__name__}: {exc}"
        finally:
            stop = subprocess.run([*cli, "stop", name], capture_output=True, text=True,
                                  timeout=120, check=False)  # fmt: skip
            rec["stop_rc"] = stop.returncode
            # The restored tree outlived the command that restored it and was handed to this
            # process (the subreaper): its zombies would hold the image's PIDs for the next one.
            reap_children()
            if stop.returncode != 0:
                rec["stop_error"] = (stop.stdout + stop.stderr)[-1500:]
        return rec

    def child_restore(self, variant: str) -> int:
        """--child-restore: one restore in this (new) process; prints its receipt's summary."""
        from coldsnap import Machine

        request = self.restore_request(variant, 99)
        t0 = time.perf_counter()
        machine = Machine.for_request(request)
        built = time.perf_counter() - t0
        receipt = machine.restore(request)
        rec = _receipt(receipt, time.perf_counter() - t0)
        rec.update(
            for_request_s=round(built, 3),
            engine_url=receipt.facts.get("engine_url"),
            engine_pid=receipt.facts.get("engine_pid"),
        )
        print(json.dumps(rec, default=str), flush=True)
        return 0 if receipt.ok else 1

    def hydration(self, receipt: Any) -> dict[str, Any]:
        """What the scheduler's plugin recorded of the refill (its status record)."""
        facts = receipt.facts
        runtime_dir = facts.get("runtime_dir") or (facts.get("capsule") or {}).get("runtime_dir")
        if not runtime_dir:
            return {"error": "no runtime_dir fact"}
        path = Path(runtime_dir) / "sglang" / "scheduler-tp0.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            return {"error": f"{path}: {exc}"}
        resume = record.get("resume") or {}
        out: dict[str, Any] = {"provider": resume.get("provider"), "seconds": resume.get("seconds")}
        out["cuda_release"] = record.get("cuda_release")  # the capture's, kept in the image
        roles = resume.get("hydrated") or {}
        # every role the refill filled (a speculative draft is one of its own), not the target only
        out["roles"] = {role: {k: d.get(k) for k in ("nbytes", "copy_seconds", "cuda_path")}
                        for role, d in roles.items() if isinstance(d, dict)}  # fmt: skip
        out["loaded"] = resume.get("loaded")  # recovery: each role's checkpoint
        hydrated = roles.get("target")
        if hydrated:  # native: the copy from the staged pack into the storages
            out["detail"] = hydrated
            out["bytes"] = hydrated.get("nbytes")
            out["copy_seconds"] = hydrated.get("copy_seconds")
            if hydrated.get("copy_seconds"):
                out["gib_per_s"] = hydrated["nbytes"] / GIB / hydrated["copy_seconds"]
        else:  # recovery: the whole reload from the checkpoint (resume seconds)
            target = (record.get("registered") or {}).get("target") or {}
            out["bytes"] = target.get("nbytes")
            if out["bytes"] and resume.get("seconds"):
                out["gib_per_s"] = out["bytes"] / GIB / resume["seconds"]
        return out

    def refusal(self) -> dict[str, Any]:
        """A capture of a server without the memory saver must fail at release_memory."""
        receipt = refusal_capture(self.root / "refusal", self.model_ref(), ENGINE_ARGS)
        rec = _receipt(receipt, receipt.seconds)
        error = receipt.error or ""
        rec["refused_at_release"] = (not receipt.ok) and "still resident" in error
        return rec

    def _event(self, event: Any) -> None:
        if event.step == "release_memory" and event.phase == "done":
            # Called in the machine's thread before the next step: the released tree still runs.
            self.results.setdefault("released_gpu_apps", []).append(gpu_apps())
        if event.phase in ("done", "failed", "compensated", "compensation_failed"):
            self.log(f"  {event.step}: {event.phase}", getattr(event, "detail", "") or "")

    # -- the run -------------------------------------------------------------------------------
    def main(self) -> int:
        if self.args.dry:
            return self.dry()
        if self.args.child_restore:
            return self.child_restore(self.args.child_restore)
        self.results["pinned_h2d"] = self.pinned_reference()
        self.log("pinned H2D", f"{self.results['pinned_h2d']['gib_per_s']:.1f} GiB/s")
        self.save()
        try:
            self.results["cold"] = self.cold_once()
            self.log("cold start to first answer", self.results["cold"]["first_answer_s"], "s")
        except Exception as exc:
            self.results["cold"] = {"error": f"{type(exc).__name__}: {exc}"}
            self.log("cold start failed", traceback.format_exc())
        self.save()
        cold = self.results["cold"].get("answers")
        for variant in self.args.variants:
            var: dict[str, Any] = {}
            self.results["variants"][variant] = var
            if self.left() < self.args.capture_s:
                var["skipped"] = f"budget: {self.left():.0f} s left"
                continue
            try:
                var["capture"] = self.capture(variant)
            except Exception:
                var["capture"] = {"error": traceback.format_exc()}
            self.log(variant, "capture", var["capture"].get("outcome"), var["capture"].get("error"))
            self.save()
            if var["capture"].get("outcome") != "done":
                continue
            var["restores"] = []
            for i in range(self.args.restores):
                if self.left() < self.args.restore_s:
                    var["restores"].append({"skipped": f"budget: {self.left():.0f} s left"})
                    continue
                try:
                    r = self.restore(variant, i, cold)
                except Exception:
                    r = {"error": traceback.format_exc()}
                var["restores"].append(r)
                self.log(variant, f"restore{i}", r.get("outcome"), r.get("first_answer_s"),
                         r.get("equal"), r.get("error") or r.get("answer_error") or "")  # fmt: skip
                self.save()
            if self.args.fresh_restore and self.left() > self.args.restore_s + 30:
                try:
                    r = self.fresh_restore(variant, cold)
                except Exception:
                    r = {"error": traceback.format_exc()}
                var["fresh_restore"] = r
                self.log(variant, "fresh-process restore", r.get("outcome"),
                         r.get("first_answer_s"), r.get("equal"), r.get("error") or "")  # fmt: skip
                self.save()
            for i in range(self.args.cli_restores):
                if self.left() < self.args.restore_s + 15:
                    break
                try:
                    r = self.cli_restore(variant, i, cold)
                except Exception:
                    r = {"error": traceback.format_exc()}
                var.setdefault("cli_restores", []).append(r)
                self.log(variant, f"cli restore{i}", r.get("rc"), r.get("first_answer_s"),
                         r.get("equal"), r.get("error") or r.get("answer_error") or "")  # fmt: skip
                self.save()
        if self.args.warm_cold:  # the same launch again, SGLang's JIT kernels now compiled
            if self.left() > self.args.capture_s:
                naive, self.args.naive = self.args.naive, False
                try:
                    self.results["cold_warm"] = self.cold_start()
                    self.log("warm cold start", self.results["cold_warm"]["first_answer_s"], "s")
                except Exception:
                    self.results["cold_warm"] = {"error": traceback.format_exc()}
                self.args.naive = naive
            else:
                self.results["cold_warm"] = {"skipped": f"budget: {self.left():.0f} s left"}
            self.save()
        if self.args.refusal:
            if self.left() > self.args.capture_s:
                try:
                    self.results["refusal"] = self.refusal()
                except Exception:
                    self.results["refusal"] = {"error": traceback.format_exc()}
            else:
                self.results["refusal"] = {"skipped": f"budget: {self.left():.0f} s left"}
        self.summary()
        self.save()
        self.copy_logs()
        return 0 if self.ok() else 1

    def ok(self) -> bool:
        for name in self.args.variants:
            var = self.results["variants"].get(name) or {}
            rs = var.get("restores") or []
            if not rs or not all(all((r.get("equal") or {0: False}).values()) for r in rs):
                return False
        refusal = self.results.get("refusal")
        return refusal is None or bool(refusal.get("refused_at_release"))

    def summary(self) -> None:
        cold_s = (self.results.get("cold") or {}).get("first_answer_s")
        warm_s = (self.results.get("cold_warm") or {}).get("first_answer_s")
        naive_s = (self.results.get("naive") or {}).get("first_answer_s")
        pinned = (self.results.get("pinned_h2d") or {}).get("gib_per_s")
        rows = []
        for name, var in self.results["variants"].items():
            cap = var.get("capture") or {}
            for i, r in enumerate(var.get("restores") or []):
                first = r.get("first_answer_s")
                hyd = (r.get("hydration") or {}).get("gib_per_s")
                rows.append({
                    "variant": name, "restore": i,
                    "cold_start_to_first_answer_s": cold_s,
                    "restore_to_first_answer_s": first,
                    "ratio": round(cold_s / first, 2) if cold_s and first else None,
                    "warm_cold_start_s": warm_s,
                    "ratio_warm": round(warm_s / first, 2) if warm_s and first else None,
                    "naive_restore_s": naive_s,
                    "ratio_naive": round(naive_s / first, 2) if naive_s and first else None,
                    "image_bytes": cap.get("image_bytes"),
                    "residual_device_bytes": cap.get("residual_device_bytes"),
                    "hydration_gib_per_s": hyd,
                    "pinned_h2d_gib_per_s": pinned,
                    "hydration_vs_pinned": round(hyd / pinned, 3) if hyd and pinned else None,
                    "answers_equal": r.get("equal"),
                })  # fmt: skip
        for name, var in self.results["variants"].items():
            warm = [
                r["first_answer_s"] for r in var.get("restores") or [] if r.get("first_answer_s")
            ]
            fresh = [
                r["first_answer_s"]
                for r in var.get("cli_restores") or []
                if r.get("first_answer_s")
            ]
            if warm and fresh:
                base, cli = statistics.median(warm), statistics.median(fresh)
                rows.append({
                    "variant": name, "cli_vs_in_process": round(cli / base, 2),
                    "cli_restore_to_first_answer_s": fresh, "in_process_s": warm,
                    "cli_answers_equal": [r.get("equal") for r in var["cli_restores"]],
                })  # fmt: skip
        self.results["summary"] = rows
        for row in rows:
            self.log("SUMMARY", json.dumps(row))

    def copy_logs(self) -> None:
        dest = self.out / "logs"
        for log in self.root.glob("**/*.log"):  # flat: deep folders do not come back
            target = dest / "__".join(log.relative_to(self.root).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                data = log.read_bytes()
                target.write_bytes(data[-2_000_000:])  # the tail: logs come back within limits
            except OSError:
                pass
        for receipt in self.root.glob("**/receipt.json"):
            target = dest / "__".join(receipt.relative_to(self.root).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(receipt, target)

    def dry(self) -> int:
        """What can be checked without a GPU: imports, requests, registry, dist-info."""
        import importlib.metadata as md

        from coldsnap.machine import REGISTRY

        checks: dict[str, Any] = {}
        for variant in self.args.variants:
            checks[variant] = {
                "capture": _plain(self.capture_request(variant)),
                "restore": _plain(self.restore_request(variant, 0)),
            }
        checks["registered"] = {k: REGISTRY.names(k) for k in ("driver", "engine", "provider")}
        from coldsnap import Machine

        machine = Machine.for_request(self.capture_request(self.args.variants[0]))
        checks["components"] = {
            role: [type(c).__name__, sorted(getattr(c, "capabilities", ()))]
            for role, c in machine.components.items()
        }
        checks["launch_argv"] = list(machine.components["engine"].launcher.base_args)
        checks["sglang_plugins"] = [
            f"{e.name} = {e.value}" for e in md.entry_points(group="sglang.srt.plugins")
        ]
        self.results["dry"] = checks
        self.save()
        print(json.dumps(checks, indent=1, default=str))
        return 0


def refusal_capture(root: Path, model: Any, engine_args: tuple[str, ...]) -> Any:
    """A capture through `Machine` of SGLang on CUDA without `--enable-memory-saver`: the
    release frees nothing, so release_memory must fail naming the resident regions (the tests'
    tests/gpu/test_sglang_release_gpu.py runs this too)."""
    from coldsnap import CaptureRequest, Machine
    from coldsnap.capsules import StoreArtifacts
    from coldsnap.drivers.n610 import N610Driver, default_cuda
    from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher
    from coldsnap.machine import REGISTRY
    from coldsnap.providers._steps import RecoveryProvider

    engine = SGLangEngine(SGLangLauncher(), cuda=True, name="sglang-nosaver")
    if "sglang-nosaver" not in REGISTRY.names("engine"):
        REGISTRY.register_engine("sglang-nosaver", build=lambda request: engine)
    machine = Machine(
        driver=N610Driver(launcher=engine.launcher, cuda=default_cuda()),
        provider=RecoveryProvider(),
        engine=engine,
        artifacts=StoreArtifacts(engine),
    )
    args = tuple(a for a in engine_args if a != "--enable-memory-saver")
    root.mkdir(parents=True, exist_ok=True)
    request = CaptureRequest(
        driver="n610", provider="recovery", engine="sglang-nosaver", model=model,
        workdir=str(root / "capture"), store=str(root / "store"), name="nosaver",
        engine_args=args,
    )  # fmt: skip
    return machine.capture(request)


def pinned_copy() -> dict[str, Any]:
    """See Run.pinned_reference."""
    import torch

    n = GIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(5):
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(n / GIB / (time.perf_counter() - t))
    del host, dev
    torch.cuda.empty_cache()
    return {"bytes": n, "gib_per_s": sorted(rates)[len(rates) // 2], "all": rates}


def gpu_apps() -> list[dict[str, Any]]:
    """Device memory per process (nvidia-smi), with each process's command name."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [{"error": str(exc)}]
    apps = []
    for line in out.splitlines():
        if "," not in line:
            continue
        pid, mib = (x.strip() for x in line.split(",", 1))
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = "?"
        apps.append({"pid": int(pid), "name": name, "mib": int(mib) if mib.isdigit() else mib})
    return apps


def _receipt(receipt: Any, seconds: float) -> dict[str, Any]:
    return {
        "outcome": receipt.outcome,
        "error": receipt.error,
        "wall_s": round(seconds, 3),
        "workdir": receipt.workdir,
        "steps": {r.name: round(r.seconds, 3) for r in receipt.steps},
    }


def _plain(record: Any) -> Any:
    import attrs

    return attrs.asdict(record) if attrs.has(type(record)) else record


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True, help="the random Llama's directory")
    p.add_argument("--size", default="small", help="its coldsnap.tiny_models size (for the id)")
    p.add_argument("--cold-json", type=Path, help="keep/reuse the cold start's record here")
    p.add_argument("--root", type=Path, default=Path("/var/tmp/coldsnap-sglang-machine"))
    p.add_argument(
        "--variants",
        type=lambda s: tuple(v for v in s.split(",") if v),
        default=VARIANTS,
        help="comma-separated, of: "
        + ", ".join(VARIANTS)
        + "; each may add ."
        + ", .".join(OPTIONS)
        + " (OPTIONS)",
    )
    p.add_argument("--restores", type=int, default=2)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    p.add_argument("--cold-s", type=float, default=300.0, help="most time for the cold start")
    p.add_argument("--capture-s", type=float, default=90.0, help="least time to start a capture")
    p.add_argument("--restore-s", type=float, default=25.0, help="least time to start a restore")
    p.add_argument("--refusal", action="store_true", help="also the memory-saver-off capture")
    p.add_argument("--dry", action="store_true", help="no GPU: check imports and requests")
    p.add_argument("--mem-frac", default="0.05", help="--mem-fraction-static of every server")
    p.add_argument(
        "--extra-args",
        default="",
        help="more engine flags for every server, cold starts included (one string), e.g. "
        '"--cuda-graph-backend-prefill disabled"',
    )
    p.add_argument("--naive", action="store_true", help="snapshot the cold server whole, too")
    p.add_argument("--warm-cold", action="store_true", help="a second cold start at the end")
    p.add_argument("--fresh-restore", action="store_true", help="one more, by a new process")
    p.add_argument(
        "--cli-restores",
        type=int,
        default=0,
        help="restores by `coldsnap restore`, a new process each",
    )
    p.add_argument("--child-restore", metavar="VARIANT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [
        v
        for v in args.variants
        if v.partition(".")[0] not in VARIANTS or v.partition(".")[2] not in ("", *OPTIONS)
    ]
    if bad:
        p.error(f"--variants: unknown {', '.join(bad)} (known: {', '.join(VARIANTS)})")
    if args.restores < 1:
        p.error("--restores: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    global ENGINE_ARGS
    args = parse(argv)
    ENGINE_ARGS = (*BASE_ARGS, "--mem-fraction-static", args.mem_frac,
                   *shlex.split(args.extra_args))  # fmt: skip
    if args.child_restore:
        return Run(args).main()
    if not args.dry:
        from coldsnap.backends import become_subreaper

        become_subreaper()
    if not args.dry:
        shutil.rmtree(args.root, ignore_errors=True)
    args.root.mkdir(parents=True, exist_ok=True)
    return Run(args).main()


if __name__ == "__main__":
    raise SystemExit(main())
