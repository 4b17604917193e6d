"""TP2 qualification of n610: two ranks, one GPU each, an NCCL group between them, captured as
one process tree and restored, then checked against the cold run.

The tree (bench/gpu/tp2_tree.py): a launcher that hosts the TCPStore and one process per rank.
The sequence, with n610's semantics on every rank:
  launch (coldsnap.backends.launch: own session, io_uring blocked) -> both ranks healthy
  -> cold: greedy tokens (graph and eager decode; the vocab-parallel head gathers logits over
     the group every step), an all-reduce, each rank's local-logits sha256 and data_ptrs
  -> POST /release on both: export the rank's native pack (payload/tp<r>/target), release
     weights, KV cache and graph (torch_memory_saver), destroy the process group, then the
     `capture/dumped` barrier
  -> CudaCheckpoint.checkpoint_all(every process of the tree: lock all, then checkpoint)
  -> Criu.dump of the tree (kills it; TCPStore connections with --tcp-established)
  restore (--restores times):
  -> Criu.restore (stopped) -> SIGCONT to the tree -> CudaCheckpoint.restore_all (restore +
     unlock) -> POST /resume on both: `restored` barrier, a new process group over the same
     store (prefix pg-N), hydrate from the pack, `resumed` barrier, all-reduce, `ready`
  -> greedy tokens equal to the cold run's on both ranks, all-reduce exact, data_ptrs and
     local-logits sha256 (graph replay and eager) bit-identical.

    python3 bench/gpu/tp2.py --out OUT --variant default --restores 2          # 2 GPUs
    python3 bench/gpu/tp2.py --out OUT --device cpu --preset tiny               # CPU: gloo
Variants (NCCL transports): default (NCCL's choice), nop2p (NCCL_P2P_DISABLE=1,
NCCL_SHM_DISABLE=1, NCCL_SOCKET_IFNAME=lo: the socket transport). NVLink multicast is off in
every process (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
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
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from tp2_tree import NO_MULTICAST  # noqa: E402 (sets them in this process too)

from coldsnap.backends import Criu, CriuError, CudaCheckpoint, become_subreaper, launch  # noqa: E402
from coldsnap.backends.procs import reap_children, tree_pids  # noqa: E402

WORLD = 2
GIB = 1 << 30
PROMPT = [1, 43, 29, 920, 526, 366, 973, 306, 626, 263, 243, 310, 278, 904]
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "nop2p": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def device_fds(pid: int) -> list[str]:
    """The /dev/nvidia* files a process holds open (CRIU cannot dump them)."""
    out = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/nvidia"):
                    out.append(f"{fd}:{target}")
    return out


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tag = f"{args.variant}{'-nvmloff' if args.nvml_shutdown else ''}-{args.device}"
        self.work = Path(args.workdir) / self.tag
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.log_path = self.out / f"tp2-{self.tag}.log"
        self.log_file = self.log_path.open("a")
        self.t0 = time.perf_counter()
        self.cuda = CudaCheckpoint() if args.device == "cuda" else None
        self.criu = Criu(args.criu)
        self.results: dict[str, Any] = {
            "format": 1,
            "kind": "coldsnap.tp2-qualification",
            "argv": sys.argv,
            "variant": args.variant,
            "variant_env": VARIANTS[args.variant],
            "no_multicast_env": NO_MULTICAST,
            "device": args.device,
            "preset": args.preset,
            "nvml_shutdown": args.nvml_shutdown,
            "host": platform.node(),
            "kernel": platform.release(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "steps": {},
            "checks": [],
            "restores": [],
        }
        self.tree_pid: int | None = None

    # -- plumbing ------------------------------------------------------------------------

    def log(self, *parts: Any) -> None:
        line = f"[{time.perf_counter() - self.t0:8.2f}] " + " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def save(self) -> None:
        path = self.out / f"tp2-{self.tag}.json"
        path.write_text(json.dumps(self.results, indent=1, sort_keys=True, default=str))

    def step(self, name: str, **facts: Any) -> None:
        """Records progress before a step that may hang (the JSON says how far it got)."""
        self.results["steps"][name] = {"at_s": round(time.perf_counter() - self.t0, 3), **facts}
        self.log("step", name, json.dumps(facts, default=str) if facts else "")
        self.save()

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        self.results["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
        self.log("CHECK", "PASS" if ok else "FAIL", name, "" if ok else detail)
        return ok

    def env(self) -> tuple[dict[str, str], list[str]]:
        """The tree's environment, and the ranks' additions (the memory saver's preload hook
        goes to the ranks only: the launcher never touches CUDA)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLDSNAP_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH")] if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(NO_MULTICAST)
        env.update(VARIANTS[self.args.variant])
        env["TORCH_NCCL_ENABLE_MONITORING"] = "0"  # no heartbeat monitor across a freeze
        if self.args.device != "cuda":  # CPU torch: PyPI torchvision needs its op shim here
            shim = REPO / "coldsnap/engines/sglang/cpu/pythonpath"
            env["PYTHONPATH"] += os.pathsep + str(shim)
            return env, []
        env.setdefault("NCCL_DEBUG", "INFO")
        import nvidia  # torch's cu13 wheels: libcudart.so.13 must resolve for the hook
        import torch_memory_saver

        site = Path(torch_memory_saver.__file__).resolve().parents[1]
        hook = site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
        if not hook.exists():
            raise RuntimeError(f"no torch_memory_saver cu13 preload hook at {hook}")
        libdirs = [str(Path(p) / "cu13/lib") for p in nvidia.__path__ if Path(p, "cu13").exists()]
        old = [env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libdirs, *old])
        return env, [f"LD_PRELOAD={hook}"]

    def url(self, rank: int) -> str:
        return f"http://127.0.0.1:{self.port_base + rank}"

    def call(self, rank: int, method: str, path: str, body: Any = None) -> Any:
        r = httpx.request(method, self.url(rank) + path, json=body, timeout=self.args.http_timeout)
        if r.status_code != 200:
            status = f"HTTP {r.status_code}: {r.text[:3000]}"
            raise RuntimeError(f"rank {rank} {method} {path}: {status}")
        return r.json()

    def both(self, fn: Callable[[int], Any]) -> list[Any]:
        """fn(rank) on every rank at once (collectives need all ranks in them)."""
        with ThreadPoolExecutor(WORLD) as pool:
            futures = [pool.submit(fn, r) for r in range(WORLD)]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]
        return [f.result() for f in futures]

    def wait_healthy(self, timeout: float, alive: Callable[[], bool]) -> float:
        start = time.perf_counter()
        pending = set(range(WORLD))
        while pending:
            for rank in sorted(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.url(rank) + "/health", timeout=5).status_code == 200:
                        pending.discard(rank)
            if pending and not alive():
                raise RuntimeError("the tree ended before every rank was healthy")
            if pending and time.perf_counter() - start > timeout:
                raise RuntimeError(f"ranks {sorted(pending)} not healthy after {timeout} s")
            time.sleep(0.1)
        return time.perf_counter() - start

    def generate(self, eager: bool = False) -> list[list[int]]:
        body = {"input_ids": PROMPT, "max_new_tokens": self.args.new_tokens, "eager": eager}
        answers = self.both(lambda r: self.call(r, "POST", "/generate", body))
        return [a["output_ids"] for a in answers]

    # -- the run -------------------------------------------------------------------------

    def run(self) -> bool:
        a = self.args
        self.log("tp2:", " ".join(sys.argv))
        self.log("criu:", self.criu.binary, self.criu.version())
        if self.cuda is not None:
            problem = self.cuda.problem()
            self.results["cuda_checkpoint_problem"] = problem
            self.log("cuda checkpoint API:", problem or "available")
            if problem:
                raise RuntimeError(problem)
        self.store_port, self.port_base = free_port(), free_port()
        while self.port_base + WORLD - 1 == self.store_port:
            self.port_base = free_port()
        env, rank_env = self.env()
        argv = [
            sys.executable, str(HERE / "tp2_tree.py"), "launcher",
            "--world", str(WORLD), "--store-port", str(self.store_port),
            "--port-base", str(self.port_base), "--payload-dir", str(self.work / "payload"),
            "--device", a.device, "--preset", a.preset,
            "--barrier-timeout", str(a.barrier_timeout),
            *(x for kv in rank_env for x in ("--rank-env", kv)),
        ]  # fmt: skip
        argv += ["--no-graph"] if a.no_graph else []
        argv += ["--nvml-shutdown"] if a.nvml_shutdown else []
        tree_log = self.out / f"tree-{self.tag}.log"
        self.step("launch", store_port=self.store_port, port_base=self.port_base)
        launched = launch(argv, log_path=tree_log, env=env, cwd=str(REPO), block_io_uring=True)
        self.tree_pid = launched.pid
        try:
            ready = self.wait_healthy(a.start_timeout, lambda: launched.poll() is None)
            self.step("healthy", seconds=round(ready, 2), pids=tree_pids(launched.pid))
            before = self.cold()
            self.capture(launched)
        finally:
            if launched.poll() is None and self.tree_pid == launched.pid:
                launched.stop(timeout=5)
            reap_children()
        self.tree_pid = None
        for i in range(a.restores):
            self.restore(i, before)
        return all(c["ok"] for c in self.results["checks"])

    def cold(self) -> dict[str, Any]:
        probes = self.both(lambda r: self.call(r, "GET", "/probe"))
        self.results["cold"] = cold = {
            "weights_bytes": [p["weights_bytes"] for p in probes],
            "gpu_used_bytes": [p.get("gpu_used_bytes") for p in probes],
            "graph_captured": [p["graph_captured"] for p in probes],
            "graph_error": [p["graph_error"] for p in probes],
            "rank_timings": [p["timings"] for p in probes],
        }
        tokens = self.generate()
        eager = self.generate(eager=True)
        self.check("cold: both ranks decode the same tokens", tokens[0] == tokens[1], tokens)
        self.check("cold: graph decode equals eager decode", tokens == eager, {"eager": eager})
        allreduce = self.both(lambda r: self.call(r, "POST", "/allreduce"))
        exact = all(x["ok"] for x in allreduce)
        self.check("cold: all-reduce exact on both ranks", exact, allreduce)
        cold.update(tokens=tokens[0], allreduce=allreduce)
        self.log("cold:", json.dumps(cold, default=str))
        return {"probes": probes, "tokens": tokens[0]}

    def capture(self, launched: Any) -> None:
        cap: dict[str, Any] = {}
        self.results["capture"] = cap
        self.step("release")
        t = time.perf_counter()
        cap["release"] = self.both(lambda r: self.call(r, "POST", "/release"))
        cap["release_wall_s"] = time.perf_counter() - t
        pids = tree_pids(launched.pid)
        cap["pids"] = pids
        cap["device_fds_before_checkpoint"] = {p: device_fds(p) for p in pids}
        if self.cuda is not None:
            self.step("cuda_checkpoint", pids=pids)
            t = time.perf_counter()
            cap["cuda_pids"] = self.cuda.checkpoint_all(pids, self.args.lock_timeout)
            cap["cuda_checkpoint_s"] = time.perf_counter() - t
            cap["states_after_checkpoint"] = {p: self.cuda.state(p) for p in cap["cuda_pids"]}
        else:
            cap["cuda_pids"] = []
        cap["device_fds_before_dump"] = {p: device_fds(p) for p in pids}
        cap["rss_before_dump_bytes"] = {p: rss_bytes(p) for p in pids}
        self.step("criu_dump")
        images = self.work / "images"
        try:
            manifest = self.criu.dump(launched.pid, images)
        except CriuError as exc:
            cap["criu_log_tail"] = _tail(getattr(exc, "log_path", None))
            raise
        cap["criu_dump_s"] = manifest.seconds
        cap["image_bytes"] = manifest.image_bytes
        with contextlib.suppress(Exception):
            launched.wait(30)
        reap_children()
        self.tree_pid = None
        self.images = images
        self.cuda_pids = cap["cuda_pids"]
        self.log("capture:", json.dumps(cap, default=str))
        self.save()

    def restore(self, i: int, before: dict[str, Any]) -> None:
        info: dict[str, Any] = {"index": i}
        self.results["restores"].append(info)
        self.step(f"restore{i}/criu_restore")
        t0 = time.perf_counter()
        try:
            tree = self.criu.restore(self.images, detached=True, stopped=True)
        except CriuError as exc:
            info["criu_log_tail"] = _tail(getattr(exc, "log_path", None))
            raise
        info["criu_restore_s"] = time.perf_counter() - t0
        self.tree_pid = tree.pid
        try:
            pids = tree_pids(tree.pid)
            info["pids"] = pids
            for pid in pids:  # the CUDA driver answers only for a running process
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if self.cuda is not None:
                self.step(f"restore{i}/cuda_restore", cuda_pids=self.cuda_pids)
                t = time.perf_counter()
                self.cuda.restore_all(self.cuda_pids)
                info["cuda_restore_unlock_s"] = time.perf_counter() - t
            if i == 0:
                self.missing_rank_check()
            self.step(f"restore{i}/resume")
            t = time.perf_counter()
            info["resume"] = self.both(
                lambda r: self.call(r, "POST", "/resume", {"nonce": str(i), "preverified": False})
            )
            info["resume_wall_s"] = time.perf_counter() - t
            tokens = self.generate()
            info["restore_to_first_answer_s"] = time.perf_counter() - t0
            label = f"restore{i}"
            for r in range(WORLD):
                self.check(
                    f"{label}: rank {r} greedy tokens equal the cold run's",
                    tokens[r] == before["tokens"], {"cold": before["tokens"], "now": tokens[r]},
                )  # fmt: skip
            eager = self.generate(eager=True)
            same = eager[0] == before["tokens"]
            self.check(f"{label}: eager decode equals the cold run's", same, eager)
            allreduce = self.both(lambda r: self.call(r, "POST", "/allreduce"))
            exact = all(x["ok"] for x in allreduce)
            self.check(f"{label}: all-reduce exact on both ranks", exact, allreduce)
            probes = self.both(lambda r: self.call(r, "GET", "/probe"))
            for r, (b, p) in enumerate(zip(before["probes"], probes, strict=True)):
                for key in ("weight_ptrs", "buffer_ptrs", "graph_ptr"):
                    self.check(f"{label}: rank {r} same {key}", p[key] == b[key])
                for key, value in b.get("local_check", {}).items():
                    now = p.get("local_check", {}).get(key)
                    self.check(f"{label}: rank {r} {key} bit-identical", now == value, [value, now])
            info["gpu_used_bytes"] = [p.get("gpu_used_bytes") for p in probes]
            self.log(f"{label}:", json.dumps(info, default=str))
        finally:
            with contextlib.suppress(Exception):
                self.criu.stop(tree, timeout=10)
            reap_children()
            self.tree_pid = None
            self.save()

    def missing_rank_check(self) -> None:
        """Rank 0 alone asks to resume: its `restored` barrier must time out naming rank 1
        (and change nothing: the barrier is the first thing a resume does)."""
        self.step("missing_rank_check")
        body = {"nonce": "alone", "barrier_timeout": 2.0}
        try:
            self.call(0, "POST", "/resume", body)
            message = "rank 0 resumed alone"
        except RuntimeError as exc:
            message = str(exc)
        expected = "barrier 'restore-alone/restored': rank 1 of 2 did not arrive within 2 s"
        self.check("a rank that does not arrive is named", expected in message, message)

    def kill_tree(self) -> None:
        if self.tree_pid is not None:
            with contextlib.suppress(Exception):
                from coldsnap.backends import stop_tree

                stop_tree(self.tree_pid, timeout=3)
            reap_children()


def _tail(path: Any, lines: int = 60) -> str | None:
    if not path:
        return None
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default="/var/tmp/coldsnap-tp2")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--preset", default="small")
    p.add_argument("--restores", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--no-graph", action="store_true")
    p.add_argument(
        "--nvml-shutdown",
        action="store_true",
        help="ranks shut NVML down after destroying the group (re-init after restore)",
    )
    p.add_argument("--barrier-timeout", type=float, default=60.0)
    p.add_argument("--lock-timeout", type=float, default=30.0)
    p.add_argument("--start-timeout", type=float, default=240.0)
    p.add_argument("--http-timeout", type=float, default=180.0)
    p.add_argument("--criu", default=os.environ.get("COLDSNAP_CRIU") or None)
    args = p.parse_args(argv)
    become_subreaper()
    run = Run(args)
    ok = False
    try:
        ok = run.run()
    except BaseException as exc:
        run.results["error"] = f"{type(exc).__name__}: {exc}"
        run.results["traceback"] = traceback.format_exc()
        run.log("ERROR", run.results["error"])
        run.log(run.results["traceback"])
        run.kill_tree()
    finally:
        run.results["ok"] = ok
        run.results["wall_s"] = round(time.perf_counter() - run.t0, 3)
        run.save()
        checks = run.results["checks"]
        run.log(
            f"tp2 {run.tag}: {'PASS' if ok else 'FAIL'}; checks "
            f"{sum(c['ok'] for c in checks)} passed, {sum(not c['ok'] for c in checks)} failed"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
