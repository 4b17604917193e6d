"""Qualifies coldsnap's n610 path on a GPU: capture a real torch workload without its weights
and KV cache, restore it at the same addresses, hydrate it, and measure P3, P4 and P5 side by
side in one run. Writes a log and a JSON of every figure to --out.

What it drives (the backends directly; see docs/qualification.md for why not the Machine yet):
  launch (coldsnap.backends.launch, io_uring blocked) -> health, greedy tokens, data_ptrs,
  graph replay -> release weights+kv_cache+cuda_graph (the workload exports the native pack)
  -> CudaCheckpoint.checkpoint_all (lock + checkpoint) -> Criu.dump
  restore: [stage: verify the pack, write the resume plan] -> Criu.restore ->
  CudaCheckpoint.restore_all (restore + unlock) -> resume (hydrate) -> first /generate
  -> same tokens, same data_ptrs, same graph replay logits.
Baseline for P5: the same workload captured whole (weights kept): lock + checkpoint + dump,
then restore + CUDA restore + first /generate.
P3: the pack of the largest size hydrated into a fresh copy of the model's storages by the
ring (the provider's Hydrator) and the registered mapping (fastpath), verification on and
off, next to a pinned host-to-device copy of the same number of bytes.

    python bench/gpu/qualify.py --out $OUT --sizes 2g,8g --naive 8g --p3 8g
    python bench/gpu/qualify.py --out /tmp/q --sizes tiny --dry     # CPU: no CUDA steps
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from coldsnap._wire import ResumePlan, write_plan  # noqa: E402
from coldsnap.backends import (  # noqa: E402
    Criu,
    CudaCheckpoint,
    become_subreaper,
    launch,
    reap_children,
)
from coldsnap.backends.procs import tree_pids  # noqa: E402

GIB = 1 << 30
PROMPT = [1, 43, 29, 920, 526, 366, 973, 306, 626, 263, 243, 310, 278, 904]
NEW_TOKENS = 16


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = path.open("a")
        self.t0 = time.perf_counter()

    def __call__(self, *parts: Any) -> None:
        line = f"[{time.perf_counter() - self.t0:8.2f}] " + " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.handle.write(line + "\n")
        self.handle.flush()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Client:
    def __init__(self, port: int) -> None:
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900.0)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, path, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{method} {path}: HTTP {r.status_code}: {r.text[:2000]}")
        return r.json()

    def wait_healthy(self, timeout: float, alive: Any) -> float:
        start = time.perf_counter()
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/health", timeout=5).status_code == 200:
                    return time.perf_counter() - start
            if not alive():
                raise RuntimeError("the workload ended before it was healthy")
            if time.perf_counter() - start > timeout:
                raise RuntimeError(f"not healthy after {timeout} s")
            time.sleep(0.05)

    def generate(self, eager: bool = False) -> list[int]:
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
            "eager": eager,
        }
        return self.call("POST", "/generate", body)["output_ids"]

    def close(self) -> None:
        self.http.close()


class Qualify:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.workdir)
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.log = Log(self.out / "qualify.log")
        self.results: dict[str, Any] = {
            "format": 1,
            "kind": "coldsnap.gpu-qualification",
            "argv": sys.argv,
            "host": platform.node(),
            "kernel": platform.release(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sizes": {},
            "checks": [],
        }
        self.criu = Criu(args.criu)
        self.cuda = CudaCheckpoint() if not args.dry else None
        self.env = self._workload_env()

    # -- plumbing ------------------------------------------------------------------------

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        self.results["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
        self.log("CHECK", "PASS" if ok else "FAIL", name, detail if not ok else "")
        return ok

    def save(self) -> None:
        path = self.out / "qualify.json"
        path.write_text(json.dumps(self.results, indent=1, sort_keys=True, default=str))

    def _workload_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLDSNAP_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if self.args.dry:
            env["PYTHONPATH"] += os.pathsep + str(REPO / "coldsnap/engines/sglang/cpu/pythonpath")
            return env
        import torch_memory_saver  # the wheel's hook library sits beside the package

        site = Path(torch_memory_saver.__file__).resolve().parents[1]
        hook = site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
        if not hook.exists():
            raise RuntimeError(f"no TMS cu13 preload hook at {hook}")
        env["LD_PRELOAD"] = str(hook)
        import nvidia  # torch's cu13 wheels: libcudart.so.13 must resolve for the hook

        libdirs = [
            str(Path(p) / "cu13" / "lib") for p in nvidia.__path__ if (Path(p) / "cu13").exists()
        ]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*libdirs, *filter(None, [env.get("LD_LIBRARY_PATH")])]
        )
        return env

    def start(self, size: str, tag: str, *, export: bool) -> tuple[Any, Client, dict]:
        port = free_port()
        runtime = self.work / size / "runtime"
        runtime.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        env["COLDSNAP_RUNTIME_DIR"] = str(runtime)
        env["COLDSNAP_ARTIFACT_DIR"] = str(self.work / size / "payload")
        if export:
            env["COLDSNAP_EXPORT_MODEL_PAYLOAD"] = "1"
        argv = [
            sys.executable,
            str(HERE / "workload.py"),
            "--port",
            str(port),
            "--preset",
            size,
            "--device",
            "cpu" if self.args.dry else "cuda",
            "--hydrate",
            self.args.hydrate,
        ]
        log_path = self.work / size / f"workload-{tag}.log"
        t0 = time.perf_counter()
        launched = launch(argv, log_path=log_path, env=env, cwd=str(REPO), block_io_uring=True)
        client = Client(port)
        ready = client.wait_healthy(900, lambda: launched.poll() is None)
        self.log(f"{size}/{tag}: workload pid {launched.pid} healthy after {ready:.1f} s")
        return launched, client, {"start_to_healthy_s": time.perf_counter() - t0, "port": port}

    def baseline(self, client: Client) -> dict[str, Any]:
        probe = client.call("GET", "/coldsnap/probe")
        tokens = client.generate()
        eager = client.generate(eager=True)
        self.check(
            "graph decode tokens equal eager decode tokens",
            tokens == eager,
            {"graph": tokens, "eager": eager},
        )
        gc = probe.get("graph_check") or {}
        if "graph_sha256" in gc:
            self.check(
                "graph replay logits equal eager logits (before capture)",
                gc["graph_max_abs_diff_vs_eager"] == 0.0,
                gc,
            )
        return {"probe": probe, "tokens": tokens}

    def compare(self, label: str, before: dict, client: Client, tokens: list[int]) -> bool:
        probe = client.call("GET", "/coldsnap/probe")
        ok = self.check(
            f"{label}: greedy tokens equal",
            tokens == before["tokens"],
            {"before": before["tokens"], "after": tokens},
        )
        b = before["probe"]
        for key in ("weight_ptrs", "buffer_ptrs", "kv_ptrs", "graph_ptrs"):
            ok &= self.check(
                f"{label}: same {key}", probe[key] == b[key], f"{len(b[key])} pointers"
            )
        gb, ga = b.get("graph_check") or {}, probe.get("graph_check") or {}
        for key in ("graph_sha256", "eager_sha256"):
            if key in gb:
                ok &= self.check(
                    f"{label}: {key.split('_')[0]} replay logits bit-identical",
                    ga.get(key) == gb[key],
                    {"before": gb[key], "after": ga.get(key)},
                )
        return ok

    def dump(self, launched: Any, images: Path, info: dict) -> Any:
        pid = launched.pid
        if self.cuda is not None:
            pids = tree_pids(pid)
            t = time.perf_counter()
            info["cuda_pids"] = self.cuda.lock_all(pids, 30.0)
            info["cuda_lock_s"] = time.perf_counter() - t
            t = time.perf_counter()
            self.cuda.checkpoint_all(pids, 30.0)
            info["cuda_checkpoint_s"] = time.perf_counter() - t
            info["state_after_checkpoint"] = self.cuda.state(pid)
        info["rss_before_dump_bytes"] = rss_bytes(pid)
        t = time.perf_counter()
        manifest = self.criu.dump(pid, images)
        info["criu_dump_s"] = time.perf_counter() - t
        info["image_bytes"] = manifest.image_bytes
        with contextlib.suppress(Exception):
            launched.wait(30)
        reap_children()
        return manifest

    def restore(self, images: Path, label: str, pids: list[int]) -> tuple[Any, dict]:
        info: dict[str, Any] = {}
        t0 = time.perf_counter()
        tree = self.criu.restore(images, detached=True)
        info["criu_restore_s"] = time.perf_counter() - t0
        if self.cuda is not None:
            t = time.perf_counter()
            self.cuda.restore_all(pids or [tree.pid])
            info["cuda_restore_unlock_s"] = time.perf_counter() - t
        info["t0"] = t0
        self.log(
            f"{label}: restored pid {tree.pid}",
            {k: round(v, 3) for k, v in info.items() if isinstance(v, float) and k != "t0"},
        )
        return tree, info

    def probe_stopped(self, size: str) -> None:
        """Can the CUDA state come back while CRIU leaves the tree stopped (the restore spec's
        order)? The driver calls may block on a stopped process and take no timeout, so they
        run in a child process that is killed if it hangs; the tree then gets SIGCONT."""
        images = self.work / size / "images"
        result: dict[str, Any] = {}
        self.results["stopped_probe"] = result
        tree = self.criu.restore(images, detached=True, stopped=True)
        code = (
            "import sys, time; from coldsnap.backends import CudaCheckpoint; c = CudaCheckpoint();"
            "pid = int(sys.argv[1]); t = time.perf_counter(); print('state', c.state(pid), "
            "flush=True); c.restore(pid); print('restored', c.state(pid), "
            "round(time.perf_counter() - t, 3), flush=True)"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(tree.pid)], stdout=subprocess.PIPE, text=True
        )
        try:
            out, _ = child.communicate(timeout=15)
            result["while_stopped"] = out.strip()
            result["returned_while_stopped"] = True
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
            result["while_stopped"] = out.strip()
            result["returned_while_stopped"] = False
        os.kill(tree.pid, signal.SIGCONT)
        try:
            assert self.cuda is not None
            result["state_after_sigcont"] = self.cuda.state(tree.pid)
            self.cuda.restore_all([tree.pid])
            result["state_after_restore_all"] = self.cuda.state(tree.pid)
        except Exception as exc:
            result["error_after_sigcont"] = f"{type(exc).__name__}: {exc}"
        self.log("stopped probe:", result)
        self.stop(tree)

    def stop(self, tree: Any) -> None:
        with contextlib.suppress(Exception):
            self.criu.stop(tree, timeout=20)
        reap_children()

    # -- the runs ------------------------------------------------------------------------

    def run_size(self, size: str) -> None:
        res: dict[str, Any] = {}
        self.results["sizes"][size] = res
        launched, client, res["start"] = self.start(size, "n610", export=True)
        try:
            before = self.baseline(client)
            probe = before["probe"]
            res["weights_bytes"] = probe["weights_bytes"]
            res["kv_bytes"] = probe["kv_bytes"]
            res["gpu_used_before_release_bytes"] = probe.get("gpu_used_bytes")
            res["workload_timings"] = probe["timings"]
            res["graph_captured"] = probe["graph_captured"]
            res["graph_error"] = probe["graph_error"]
            self.log(
                f"{size}: weights {probe['weights_bytes'] / GIB:.2f} GiB, kv "
                f"{probe['kv_bytes'] / GIB:.2f} GiB, graph {probe['graph_captured']}"
            )
            t = time.perf_counter()
            res["release"] = client.call("POST", "/release_memory_occupation", {"tags": None})
            res["release_s"] = time.perf_counter() - t
            after = client.call("GET", "/coldsnap/probe?graph=0")
            res["gpu_used_after_release_bytes"] = after.get("gpu_used_bytes")
            self.log(f"{size}: released", res["release"])
            capture: dict[str, Any] = {}
            images = self.work / size / "images"
            self.dump(launched, images, capture)
            res["capture"] = capture
            res["P4"] = {
                "image_bytes": capture["image_bytes"],
                "weights_bytes": res["weights_bytes"],
                "image_gib": capture["image_bytes"] / GIB,
                "weights_gib": res["weights_bytes"] / GIB,
            }
            self.log(f"{size}: capture", capture)
        finally:
            client.close()
            if launched.poll() is None:
                launched.stop()
        self.save()
        payload = self.work / size / "payload"
        res["restores"] = []
        for verify in self.args.restore_verify:
            label = f"{size}/restore-verify-{verify}"
            stage: dict[str, Any] = {}
            preverified = verify == "staged"
            if preverified:  # stage_payload: verify the pack before the process comes back
                from coldsnap.plugin._payload import pack_dir
                from coldsnap.providers import PackDirectory, verify_pack

                stage["verify_s"] = verify_pack(PackDirectory(pack_dir(payload, 0, "target")))
            write_plan(
                Path(self.env_runtime(size)),
                ResumePlan(source="payload", payload_dir=str(payload), preverified=preverified),
            )
            tree, info = self.restore(images, label, capture.get("cuda_pids", []))
            info["stage"] = stage
            info["hydrate_in"] = "workload (resume of weights)"
            client = Client(res["start"]["port"])
            try:
                t = time.perf_counter()
                info["resume"] = client.call("POST", "/resume_memory_occupation", {"tags": None})
                info["resume_s"] = time.perf_counter() - t
                tokens = client.generate()
                info["restore_to_first_answer_s"] = time.perf_counter() - info.pop("t0")
                info["ok"] = self.compare(label, before, client, tokens)
            finally:
                client.close()
                self.stop(tree)
            self.log(f"{label}:", json.dumps(info, default=str))
            res["restores"].append({"verify": verify, **info})
            self.save()

    def env_runtime(self, size: str) -> Path:
        return self.work / size / "runtime"

    def run_naive(self, size: str) -> None:
        res: dict[str, Any] = {}
        self.results.setdefault("naive", {})[size] = res
        launched, client, res["start"] = self.start(size, "naive", export=False)
        try:
            before = self.baseline(client)
            res["weights_bytes"] = before["probe"]["weights_bytes"]
            capture: dict[str, Any] = {}
            images = self.work / size / "naive-images"
            self.dump(launched, images, capture)
            res["capture"] = capture
            self.log(f"{size}/naive: capture", capture)
        finally:
            client.close()
            if launched.poll() is None:
                launched.stop()
        self.save()
        res["restores"] = []
        for i in range(self.args.naive_restores):
            label = f"{size}/naive-restore-{i}"
            tree, info = self.restore(images, label, capture.get("cuda_pids", []))
            client = Client(res["start"]["port"])
            try:
                tokens = client.generate()
                info["restore_to_first_answer_s"] = time.perf_counter() - info.pop("t0")
                info["ok"] = self.compare(label, before, client, tokens)
            finally:
                client.close()
                self.stop(tree)
            self.log(f"{label}:", json.dumps(info, default=str))
            res["restores"].append(info)
            self.save()
        shutil.rmtree(images, ignore_errors=True)

    def run_p3(self, size: str) -> None:
        import p3

        from coldsnap.plugin._payload import pack_dir

        source_dir = pack_dir(self.work / size / "payload", 0, "target")
        self.results["P3"] = p3.measure(source_dir, reps=self.args.reps, log=self.log)
        self.save()

    def summary(self) -> dict[str, Any]:
        s: dict[str, Any] = {}
        for size, res in self.results["sizes"].items():
            if "P4" in res:
                p4 = res["P4"]
                s[f"P4 {size}"] = (
                    f"image {p4['image_gib']:.2f} GiB for {p4['weights_gib']:.2f} GiB of weights"
                )
            for r in res.get("restores", []):
                if "restore_to_first_answer_s" in r:
                    h = (r.get("resume") or {}).get("hydrate") or {}
                    s[f"restore {size} verify={r['verify']}"] = (
                        f"{r['restore_to_first_answer_s']:.3f} s to first correct answer; "
                        f"hydrate {h.get('method')} {h.get('gib_per_s', 0):.1f} GiB/s; ok={r['ok']}"
                    )
        for size, res in self.results.get("naive", {}).items():
            times = [r["restore_to_first_answer_s"] for r in res.get("restores", [])]
            if times:
                s[f"naive {size}"] = f"median {statistics.median(times):.3f} s ({len(times)} runs)"
                for r in self.results["sizes"].get(size, {}).get("restores", []):
                    if "restore_to_first_answer_s" in r:
                        ours = r["restore_to_first_answer_s"]
                        s[f"P5 {size} verify={r['verify']}"] = (
                            f"naive {statistics.median(times):.3f} s / ours {ours:.3f} s = "
                            f"{statistics.median(times) / ours:.2f}x"
                        )
        p3r = self.results.get("P3", {})
        for key, value in p3r.get("summary", {}).items():
            s[f"P3 {key}"] = value
        failed = [c["name"] for c in self.results["checks"] if not c["ok"]]
        s["checks"] = f"{len(self.results['checks']) - len(failed)} passed, {len(failed)} failed"
        if failed:
            s["failed"] = failed
        return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default="/var/tmp/coldsnap-qualify")
    p.add_argument("--sizes", default="tiny", help="comma-separated workload presets")
    p.add_argument("--naive", default="", help="presets to capture whole (P5 baseline)")
    p.add_argument("--naive-restores", type=int, default=2)
    p.add_argument("--p3", default="", help="preset whose pack P3 hydrates (one of --sizes)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--restore-verify",
        default="inline,staged",
        help="restores per size: inline (workload verifies while copying), "
        "staged (the controller verifies before the restore)",
    )
    p.add_argument("--hydrate", choices=("auto", "registered", "ring"), default="auto")
    p.add_argument(
        "--probe-stopped",
        action="store_true",
        help="last: restore the last size stopped and try the CUDA restore then",
    )
    p.add_argument("--criu", default=str(REPO / ".criu-bundle" / "criu"))
    p.add_argument("--dry", action="store_true", help="CPU: no CUDA steps, no P3")
    args = p.parse_args(argv)
    args.restore_verify = [v for v in args.restore_verify.split(",") if v]
    become_subreaper()
    q = Qualify(args)
    q.log("qualify:", " ".join(sys.argv))
    q.log("criu:", q.criu.binary, q.criu.version())
    if q.cuda is not None:
        q.results["cuda_checkpoint_problem"] = q.cuda.problem()
        q.log("cuda checkpoint API:", q.cuda.problem() or "available")
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            q.check(
                "has_context is False for a process without CUDA",
                not q.cuda.has_context(sleeper.pid),
                sleeper.pid,
            )
        finally:
            sleeper.kill()
            sleeper.wait()
    status = 0
    steps = [(f"size {s}", q.run_size, s) for s in args.sizes.split(",") if s]
    steps += [(f"naive {s}", q.run_naive, s) for s in args.naive.split(",") if s]
    if args.p3 and not args.dry:
        steps.append((f"P3 {args.p3}", q.run_p3, args.p3))
    if args.probe_stopped and not args.dry and steps:
        last = [s for s in args.sizes.split(",") if s][-1]
        steps.append((f"stopped probe {last}", q.probe_stopped, last))
    for name, fn, size in steps:
        try:
            fn(size)
        except Exception as exc:
            status = 1
            q.log(f"{name}: FAILED: {type(exc).__name__}: {exc}")
            q.log(traceback.format_exc())
            q.results.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
            q.check(f"{name} ran", False, str(exc)[:2000])
        q.save()
    q.results["summary"] = q.summary()
    q.save()
    q.log("SUMMARY", json.dumps(q.results["summary"], indent=1))
    if any(not c["ok"] for c in q.results["checks"]):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
