"""Release-path experiments on a real SGLang 0.5.17 server (CUDA graphs on) on the H200: what a
snapshot that releases weights, KV cache and graph memory first must do so that the restored
server answers. Bench only: drives coldsnap's backends (launch, CudaCheckpoint, Criu) directly,
not the Machine, and runs code in the scheduler through the probe plugin (probe/csprobe.py).

Scenarios (in order, each on the live server, relaunching it when one kills it):
  refs      cold greedy answers of 4 prompts, the prefix cache flushed before each
  plain     POST /release_memory_occupation, then /resume_memory_occupation (in the given tag
            steps), refill the weights from the probe's host copy, answer the prompts
  criu      release (+ the probe's pre-checkpoint actions) -> CUDA lock + checkpoint -> CRIU dump;
            then per restore: CRIU restore -> CUDA restore + unlock -> resume (+ refill, + the
            probe's post-restore actions) -> answers; one image restored several times
Writes results.json, run.log and the probe's events to --out.

    python3 bench/gpu/sglang/release_path.py --out $OUT --model /tmp/model --plan plan.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from coldsnap.backends import Criu, CudaCheckpoint, become_subreaper, launch, reap_children
from coldsnap.backends.procs import tree_pids

GIB = 1 << 30
PROBE_DIR = Path(os.environ.get("CSPROBE_DIR", "/dev/shm/csprobe"))
NEW_TOKENS = 16


def _prompt(seed: int, n: int) -> list[int]:
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % 990)
    return out


PROMPTS = {f"P{i}": _prompt(1000 + 17 * i, 18 + 5 * i) for i in range(1, 5)}


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget
        self.logf = (self.out / "run.log").open("a")
        self.results: dict[str, Any] = {"argv": sys.argv, "scenarios": [], "servers": []}
        self.criu = Criu(args.criu)
        self.cuda = None if args.dry else CudaCheckpoint()
        self.server: dict[str, Any] | None = None
        self.refs: dict[str, list[int]] = {}
        self.work = Path(args.workdir)
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        shutil.rmtree(PROBE_DIR, ignore_errors=True)
        PROBE_DIR.mkdir(parents=True)

    # -- plumbing ------------------------------------------------------------------------

    def log(self, *parts: Any) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}] " + " ".join(
            p if isinstance(p, str) else json.dumps(p, default=str) for p in parts
        )
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str))
        events = PROBE_DIR / "events.jsonl"
        with contextlib.suppress(OSError):
            if events.exists():
                shutil.copy(events, self.out / "probe-events.jsonl")
            _collect_logs(self)

    def control(self, **ctl: Any) -> None:
        (PROBE_DIR / "control.json").write_text(json.dumps(ctl))

    def events(self) -> list[dict]:
        path = PROBE_DIR / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    def new_events(self, since: int) -> list[dict]:
        return self.events()[since:]

    def http(self) -> httpx.Client:
        assert self.server is not None
        return httpx.Client(base_url=f"http://127.0.0.1:{self.server['port']}", timeout=120.0)

    def post(self, path: str, body: Any = None, timeout: float = 120.0) -> tuple[float, Any]:
        t = time.perf_counter()
        with self.http() as c:
            r = c.post(path, json=body, timeout=timeout)
        dt = time.perf_counter() - t
        if r.status_code != 200:
            raise RuntimeError(f"POST {path}: HTTP {r.status_code}: {r.text[:1000]}")
        try:
            return dt, r.json()
        except ValueError:
            return dt, r.text

    def generate(self, name: str) -> tuple[float, list[int]]:
        """One greedy answer; gives up early when a member of the server's tree dies (a crashed
        scheduler can leave the HTTP request hanging)."""
        import concurrent.futures

        body = {
            "input_ids": PROMPTS[name],
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
        }
        pids = list((self.server or {}).get("pids") or [])
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(self.post, "/generate", body, 60.0)
            dead_since = None
            while True:
                try:
                    dt, out = fut.result(timeout=0.2)
                    return dt, list(out["output_ids"])
                except concurrent.futures.TimeoutError:
                    pass
                dead = [p for p in pids if not _running(p)]
                if dead and dead_since is None:
                    dead_since = time.monotonic()
                if dead_since is not None and time.monotonic() - dead_since > 3.0:
                    raise RuntimeError(f"tree members died during /generate: {dead}")

    def flush(self) -> None:
        with self.http() as c:
            c.post("/flush_cache", timeout=60)

    def alive(self) -> dict[str, Any]:
        assert self.server is not None
        root = self.server["pid"]
        try:
            pids = tree_pids(root)
        except Exception:
            pids = []
        return {"root_alive": Path(f"/proc/{root}").exists(), "tree": pids}

    def gpu_apps(self) -> str:
        with contextlib.suppress(Exception):
            return subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip()  # fmt: skip
        return ""

    def server_log_tail(self, n: int = 60) -> list[str]:
        assert self.server is not None
        try:
            lines = Path(self.server["log"]).read_text(errors="replace").splitlines()
        except OSError:
            return []
        keys = ("Error", "error", "Traceback", "Fatal", "Segmentation", "File \"", "Exception",
                "csprobe", "SIGSEGV", "signal", "killed", "Killed")  # fmt: skip
        picked = [x for x in lines if any(k in x for k in keys)]
        return picked[-n:]

    # -- server lifecycle ----------------------------------------------------------------

    def launch(self, label: str, frac: float, extra: list[str], senv: dict) -> None:
        self.stop()
        port = _free_port()
        log = self.work / f"server-{label}.log"
        argv = [
            sys.executable, "-m", "sglang.launch_server", "--model-path", self.args.model,
            "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "triton",
            "--sampling-backend", "pytorch", "--grammar-backend", "none", "--enable-memory-saver",
            "--mem-fraction-static", str(frac), "--cuda-graph-max-bs", "8", *extra,
        ]  # fmt: skip
        if self.args.dry:  # a stand-in server, for testing this harness without a GPU
            argv = [sys.executable, self.args.dry, "--port", str(port)]
        env = dict(os.environ)
        env["SGLANG_PLUGINS"] = "csprobe"
        env["CSPROBE_DIR"] = str(PROBE_DIR)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.update(self.args.server_env)
        env.update(senv)
        with contextlib.suppress(Exception):
            import nvidia  # torch's cu13 runtime, for the memory saver's preload hook

            libdirs = [str(Path(p) / "cu13" / "lib") for p in nvidia.__path__]
            env["LD_LIBRARY_PATH"] = ":".join(
                [d for d in libdirs if Path(d).exists()] + [env.get("LD_LIBRARY_PATH", "")]
            ).strip(":")
        t = time.perf_counter()
        launched = launch(argv, log_path=log, env=env, cwd=str(self.work), block_io_uring=True)
        self.server = {"label": label, "pid": launched.pid, "port": port, "log": str(log),
                       "launched": launched, "frac": frac, "extra": extra, "env": senv}  # fmt: skip
        rec = {"label": label, "frac": frac, "extra": extra, "env": senv, "argv": argv}
        self.results["servers"].append(rec)
        self.log(f"launch {label}: pid {launched.pid} port {port}", argv[3:])
        while True:
            with contextlib.suppress(httpx.HTTPError), self.http() as c:
                if c.get("/health", timeout=5).status_code == 200:
                    break
            if launched.poll() is not None:
                rec["error"] = "exited before healthy"
                rec["log"] = self.server_log_tail(80)
                raise RuntimeError(f"server {label} exited before healthy")
            if self.left() < 5:
                raise RuntimeError("no time left while starting")
            time.sleep(0.25)
        rec["healthy_s"] = time.perf_counter() - t
        self.generate("P1")
        rec["first_answer_s"] = time.perf_counter() - t
        rec["gpu_apps"] = self.gpu_apps()
        rec["tree"] = self.server["pids"] = tree_pids(launched.pid)
        self.log(
            f"{label}: healthy {rec['healthy_s']:.1f} s, first answer {rec['first_answer_s']:.1f} s"
        )
        self.save()

    def stop(self) -> None:
        if self.server is None:
            return
        s, self.server = self.server, None
        if "tree" not in s or s["tree"] is not None:
            _kill_tree(s["pid"])

    # -- scenarios -----------------------------------------------------------------------

    def cold_refs(self) -> dict:
        res: dict[str, Any] = {"name": "refs", "server": self.server["label"]}
        previous = dict(self.refs)
        for name in PROMPTS:
            self.flush()
            _, toks = self.generate(name)
            self.refs[name] = toks
            res[name] = toks
        if previous:
            res["equal_previous_server"] = previous == self.refs
        self.flush()
        _, again = self.generate("P1")
        res["P1_again_after_flush_equal"] = again == self.refs["P1"]
        self.flush()
        self.log("refs", res)
        return res

    def answer_all(
        self, res: dict, t_first: float | None = None, expect_wrong: bool = False
    ) -> None:
        """Answers every prompt once (the prefix cache is empty after a KV release) and compares
        with the cold answers; stops at the first failure and says whether the tree died."""
        res["answers"] = {}
        for i, name in enumerate(PROMPTS):
            try:
                dt, toks = self.generate(name)
            except Exception as exc:
                time.sleep(2.0)
                res["answers"][name] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
                res["died"] = self.alive()
                res["server_log"] = self.server_log_tail()
                res["ok"] = False
                self.log(f"{res['name']}: {name} failed:", res["answers"][name], res["died"])
                return
            equal = toks == self.refs.get(name)
            res["answers"][name] = {"s": round(dt, 4), "equal_cold": equal}
            if not equal:
                res["answers"][name]["tokens"] = toks
            if i == 0 and t_first is not None:
                res["restore_to_first_answer_s"] = time.perf_counter() - t_first
        res["served"] = True
        res["all_equal_cold"] = all(a.get("equal_cold") for a in res["answers"].values())
        res["ok"] = expect_wrong or res["all_equal_cold"]

    def plain(self, sc: dict) -> dict:
        res: dict[str, Any] = {"name": sc["name"], "kind": "plain", "server": self.server["label"],
                               "release_tags": sc.get("release_tags"),
                               "resume_steps": sc.get("resume_steps", [None])}  # fmt: skip
        n0 = len(self.events())
        self.control(**sc.get("control", {}))
        res["release_http_s"], _ = self.post(
            "/release_memory_occupation", {"tags": sc.get("release_tags")}
        )
        res["gpu_apps_released"] = self.gpu_apps()
        for step in sc.get("resume_steps", [None]):
            dt, _ = self.post("/resume_memory_occupation", {"tags": step})
            res.setdefault("resume_http_s", []).append(round(dt, 4))
        self.answer_all(res, expect_wrong=sc.get("expect_wrong", False))
        res["probe"] = _slim(self.new_events(n0))
        return res

    def criu_cycle(self, sc: dict) -> dict:
        res: dict[str, Any] = {"name": sc["name"], "kind": "criu", "server": self.server["label"],
                               "release_tags": sc.get("release_tags"),
                               "resume_steps": sc.get("resume_steps", [None])}  # fmt: skip
        images = self.work / f"img-{sc['name']}"
        n0 = len(self.events())
        self.control(**sc.get("control", {}))
        res["release_http_s"], _ = self.post(
            "/release_memory_occupation", {"tags": sc.get("release_tags")}
        )
        res["gpu_apps_released"] = self.gpu_apps()
        root = self.server["pid"]
        pids = tree_pids(root)
        cuda_pids: list[int] = []
        if self.cuda is not None:
            t = time.perf_counter()
            cuda_pids = self.cuda.lock_all(pids, 30.0)
            res["cuda_lock_s"] = time.perf_counter() - t
            t = time.perf_counter()
            self.cuda.checkpoint_all(pids, 30.0)
            res["cuda_checkpoint_s"] = time.perf_counter() - t
        res["cuda_pids"] = cuda_pids
        res["rss_gib"] = {p: round(_rss(p) / GIB, 3) for p in pids}
        t = time.perf_counter()
        manifest = self.criu.dump(root, images)
        res["criu_dump_s"] = time.perf_counter() - t
        res["image_gib"] = round(manifest.image_bytes / GIB, 3)
        with contextlib.suppress(Exception):
            self.server["launched"].wait(30)
        reap_children()
        res["probe_capture"] = _slim(self.new_events(n0))
        self.log(f"{sc['name']}: captured", {k: v for k, v in res.items() if k != "probe_capture"})
        self.server["tree"] = None
        res["restores"] = []
        for i, rctl in enumerate(sc.get("restores", [{}])):
            if self.left() < 40:
                res["restores"].append({"skipped": "no time"})
                break
            if i:
                self.stop_tree()
            r: dict[str, Any] = {"name": f"{sc['name']}#{i}", "control": rctl}
            n1 = len(self.events())
            self.control(**rctl)
            t_first = time.perf_counter()
            tree = self.criu.restore(images, detached=True)
            r["criu_restore_s"] = time.perf_counter() - t_first
            self.server["tree"] = tree
            self.server["pids"] = pids
            if self.cuda is not None:
                t = time.perf_counter()
                self.cuda.restore_all(cuda_pids)
                r["cuda_restore_unlock_s"] = time.perf_counter() - t
            try:
                for step in sc.get("resume_steps", [None]):
                    dt, _ = self.post("/resume_memory_occupation", {"tags": step})
                    r.setdefault("resume_http_s", []).append(round(dt, 4))
                self.answer_all(r, t_first, expect_wrong=sc.get("expect_wrong", False))
            except Exception as exc:
                r["error"] = f"{type(exc).__name__}: {exc}"[:600]
                r["died"] = self.alive()
                r["server_log"] = self.server_log_tail()
                r["ok"] = False
            r["probe"] = _slim(self.new_events(n1))
            r["gpu_apps"] = self.gpu_apps()
            self.log(
                f"{r['name']}:", {k: v for k, v in r.items() if k not in ("probe", "server_log")}
            )
            res["restores"].append(r)
            self.save()
            if not r.get("ok") and i + 1 < len(sc.get("restores", [])):
                continue
        res["ok"] = all(r.get("ok") for r in res["restores"])
        last = res["restores"][-1] if res["restores"] else {}
        if not last.get("ok"):
            self.stop_tree()
            self.server = None
        shutil.rmtree(images, ignore_errors=True)
        return res

    def stop_tree(self) -> None:
        if self.server and self.server.get("tree") is not None:
            _kill_tree(self.server["pid"])
            self.server["tree"] = None

    def run(self, plan: list[dict]) -> None:
        self.log("plan", plan)
        for sc in plan:
            need = sc.get("need_s", 30)
            cond = sc.get("if", "")
            if cond.startswith("failed:"):
                named = [r for r in self.results["scenarios"] if r.get("name") == cond[7:]]
                if not named or named[-1].get("ok") or named[-1].get("skipped"):
                    self.log(f"skip {sc['name']}: {cond} does not hold")
                    continue
            if (
                self.server is None
                or sc.get("relaunch")
                or (sc.get("frac") and sc["frac"] != self.server.get("frac"))
            ):
                need += 75 if len(self.results["servers"]) else 160
            if self.left() < need:
                self.log(f"skip {sc['name']}: {self.left():.0f} s left, needs {need}")
                self.results["scenarios"].append({"name": sc["name"], "skipped": "no time"})
                continue
            try:
                if (
                    self.server is None
                    or sc.get("relaunch")
                    or (sc.get("frac") and sc["frac"] != self.server.get("frac"))
                    or sc.get("extra", []) != (self.server or {}).get("extra", [])
                    or sc.get("env", {}) != (self.server or {}).get("env", {})
                ):
                    label = f"{len(self.results['servers']) + 1}"
                    try:
                        self.launch(
                            label, sc.get("frac", 0.3), sc.get("extra", []), sc.get("env", {})
                        )
                    except Exception:
                        self.launch_failed = True
                        raise
                    self.results["scenarios"].append(self.cold_refs())
                kind = sc["kind"]
                if sc.get("tags_from_best"):
                    best = [
                        r
                        for r in self.results["scenarios"]
                        if r.get("kind") == "plain" and r.get("ok")
                    ]
                    if best:
                        sc = {
                            **sc,
                            "release_tags": best[0]["release_tags"],
                            "resume_steps": best[0]["resume_steps"],
                        }
                        self.log(
                            f"{sc['name']}: tags from {best[0]['name']}",
                            sc["release_tags"],
                            sc["resume_steps"],
                        )
                res = self.plain(sc) if kind == "plain" else self.criu_cycle(sc)
                if res.get("died") or (kind == "plain" and not res.get("ok") and "died" in res):
                    self.stop()
            except Exception as exc:
                res = {"name": sc["name"], "error": f"{type(exc).__name__}: {exc}"[:2000],
                       "trace": traceback.format_exc()[-3000:]}  # fmt: skip
                if self.server:
                    res["died"] = self.alive()
                    res["server_log"] = self.server_log_tail()
                self.stop()
            self.log(f"scenario {sc['name']}: ok={res.get('ok')}", res.get("error", ""))
            self.results["scenarios"].append(res)
            self.save()
            if getattr(self, "launch_failed", False):
                self.log("a server did not start: stopping the plan")
                break
        self.stop()
        self.save()


def _slim(events: list[dict]) -> list[dict]:
    out = []
    for e in events:
        e = dict(e)
        e.pop("wall", None)
        out.append(e)
    return out


def _kill_tree(root: int) -> None:
    """SIGKILL to the whole tree (a clean SGLang stop takes seconds), then reap: we are the
    subreaper of the launched and the restored trees."""
    import signal

    members = tree_pids(root)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        reap_children()
        if not any(Path(f"/proc/{p}").exists() for p in members):
            return
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--plan", required=True, help="JSON list of scenarios")
    p.add_argument("--criu", default="/tmp/criu-bundle/criu")
    p.add_argument("--workdir", default="/var/tmp/csprobe")
    p.add_argument("--budget", type=float, default=520.0, help="seconds for the whole run")
    p.add_argument("--server-env", default="{}", help="JSON: extra env for the server")
    p.add_argument("--dry", default="", help="a stand-in server script; no CUDA steps")
    args = p.parse_args()
    args.server_env = json.loads(args.server_env)
    become_subreaper()
    run = Run(args)
    run.log(
        "criu",
        str(run.criu.binary),
        str(run.criu.version()),
        "cuda:",
        run.cuda.problem() or "ok" if run.cuda else "dry",
    )
    run.results["prompts"] = PROMPTS
    try:
        run.run(json.loads(Path(args.plan).read_text()))
    finally:
        run.stop()
        run.save()
        events = PROBE_DIR / "events.jsonl"
        if events.exists():
            shutil.copy(events, run.out / "probe-events.jsonl")
        _collect_logs(run)
    return 0


def _collect_logs(run: Run) -> None:
    """The servers' logs, filtered (SGLang is verbose): every line that names an error, a
    hook, the probe or a signal, plus each log's last 80 lines; at most 3 MB in all."""
    keys = ("rror", "Traceback", "Fatal", "Segmentation", "File \"", "xception", "csprobe",
            "SIGSEGV", "signal", "hook", "plugin", "Killed", "memory_saver", "Memory", "Capture",
            "capture", "ready", "Warning", "WARNING")  # fmt: skip
    out = []
    for log in sorted(run.work.glob("server-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        out.append(f"===== {log.name} ({len(lines)} lines) =====")
        picked = [x for x in lines if any(k in x for k in keys)]
        out += [x[:600] for x in picked[-400:]]
        out.append(f"----- last 80 lines of {log.name} -----")
        out += [x[:600] for x in lines[-80:]]
    text = "\n".join(out)[-3_000_000:]
    (run.out / "servers.log").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
