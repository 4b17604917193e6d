"""The architecture matrix on the H200: per architecture, a cold start and captures through
`Machine`, each restored twice and compared token for token with the cold start (bench only,
not the product).

    python3 -P bench/gpu/matrix.py --out OUT [--archs llama-tied,qwen2,...]
        [--variants n610-native,n610-recovery,n580-native,n580-recovery,cli] [--restores 2]
        [--cli-restores 0] [--jobs 4] [--budget 540] [--arch-s 170] [--mem-frac 0.5]
        [--max-tokens 16384] [--engine-args "..."] [--root DIR] [--dry]

Per architecture (ENTRIES, in order of importance), in a process of its own (bench/gpu/
sglang_machine.py's `Run`, imported, does each part): the model is built on the device
(coldsnap.tiny_models); a cold start of the capture's own launch command (SGLang with coldsnap's
plugin and the memory saver) is timed to its first answer, asked every prompt with the prefix
cache flushed before each, and stopped; then per variant a capture through
`Machine.for_request(CaptureRequest(...))` and `--restores` restores, each timed from the call
to its first answer and compared with the cold answers on every prompt; `--cli-restores N` adds
N restores by `coldsnap restore` in a new process. The variant `cli` is the operator's path
instead: `coldsnap capture -- python3 -m sglang.launch_server ...` (n610 native, the command
line's defaults), then `--restores` restores by `coldsnap restore`, each timed from the spawn to
the first answer. A capture that is refused keeps its receipt's error: the reason.

Up to `--jobs` architectures run side by side (their servers share the GPU at `--mem-frac`
each); an architecture starts only while `--arch-s` seconds are left, and whatever still runs
when `--budget` is spent is stopped and recorded as cut. Restore and cold seconds measured side
by side include the other architectures' load: `--jobs 1` for timings.

OUT/matrix.json is rewritten whenever an architecture ends; OUT/matrix.md holds the table (one
row per architecture, driver and provider, as docs/qualification.md has them), also printed.
`--dry` runs here, on CPU: imports, every entry's model built, every request and launch command
validated, nothing launched. On a CPU host with SGLang and CRIU, `--engine-args ""` runs the
matrix itself (the adapter's CPU flags) as a check of the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import sglang_machine as sm  # noqa: E402 (this directory goes on the path first)

# name -> (tiny_models arch, size, tied), in order of importance. Sizes keep each model's head
# size where the real models have theirs (Llama 3.2 and Qwen3 small models: 64), except Qwen2's
# tiny head size 16, which takes SGLang's fallback rotary kernel on CUDA (it recasts the cache
# after load); Phi-3's 96 does too, as Phi-3 mini's.
ENTRIES: dict[str, tuple[str, str, bool | None]] = {
    "llama-tied": ("llama", "small", True),
    "qwen2": ("qwen2", "tiny", None),
    "phi3": ("phi3", "tiny", None),
    "llama-rope": ("llama3", "small", None),
    "mistral": ("mistral", "tiny", None),
    "gemma2": ("gemma2", "tiny", None),
    "qwen2moe": ("qwen2moe", "tiny", None),
    "qwen3": ("qwen3", "small", None),
    "llama": ("llama", "small", None),
}
# Behaviours of the issue on the seed's GPU paths, each on the untied Llama `small`: a speculative
# draft (a Llama `tiny` of the same tokenizer, SGLang's STANDALONE algorithm), decode graphs
# captured at the first scheduler-idle boundary, and graphs in the memory saver's region
# (destroyed at release, captured again at resume). Named with --archs; not in the default set.
SPEC_ARGS = (
    "--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
)  # fmt: skip
BEHAVIOURS: dict[str, dict[str, Any]] = {
    "spec": {"draft": ("llama", "tiny"), "engine_args": SPEC_ARGS, "stubs": True},
    "async": {"async_cuda_graphs": True},
    "graphs": {"engine_options": {"cuda_graphs_in_saver": "1"}},
}
# The same draft under a second name, so that its n580 variants run side by side with the n610
# ones in one device call (an entry's variants run one after another).
BEHAVIOURS["spec-n580"] = BEHAVIOURS["spec"]
VARIANTS = ("n610-native", "n610-recovery", "n580-native", "n580-recovery", "cli")
CLI = "cli"  # the operator's path: `coldsnap capture -- <launch command>`, `coldsnap restore`


# -- one architecture -----------------------------------------------------------------------------


class ArchRun(sm.Run):
    """sglang_machine's run, on one entry's model (named after the entry in the capsule)."""

    def __init__(self, args: argparse.Namespace, entry: str) -> None:
        super().__init__(args)
        self.entry = entry
        self.results["entry"] = entry

    def model_ref(self) -> Any:
        from coldsnap import ModelRef

        return ModelRef(id=f"{self.entry}-random", revision="seed0", path=str(self.args.model))

    def extras(self, driver: str, operation: str) -> dict[str, Any]:
        """The entry's behaviour as request fields (the same at capture and restore, where a
        restore takes them: a driver that resumes the captured process refuses
        async_cuda_graphs at restore, it keeps the capture's)."""
        extra = BEHAVIOURS.get(self.entry, {})
        out: dict[str, Any] = {}
        if "draft" in extra:
            from coldsnap import ModelRef

            out["draft"] = ModelRef(id=f"{self.entry}-draft-random", revision="seed1",
                                    path=self.results["model"]["draft_path"])  # fmt: skip
        if "engine_args" in extra:
            out["engine_args"] = (*sm.ENGINE_ARGS, *extra["engine_args"])
        if "engine_options" in extra:
            out["engine_options"] = dict(extra["engine_options"])
        if extra.get("async_cuda_graphs") and (operation == "capture" or driver == "n580"):
            out["async_cuda_graphs"] = True
        return out

    def capture_request(self, variant: str, *, engine: str = "sglang") -> Any:
        import attrs

        request = super().capture_request(variant, engine=engine)
        return attrs.evolve(request, **self.extras(request.driver, "capture"))

    def restore_request(self, variant: str, i: int) -> Any:
        import attrs

        request = super().restore_request(variant, i)
        return attrs.evolve(request, **self.extras(request.driver, "restore"))

    def flush(self, url: str) -> None:
        """SGLang refuses to flush its cache (HTTP 400) until its scheduler is idle: right after
        a cold server's first answer, its own warmup request may still run (seen on CPU)."""
        deadline = time.monotonic() + 30.0
        while True:
            try:
                return super().flush(url)
            except RuntimeError as exc:
                if "HTTP 400" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def save(self) -> None:
        path = self.out / "result.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(path)


def build_entry(entry: str, models: Path) -> dict[str, Any]:
    """Builds an entry's model under `models` (reused when already built there)."""
    from coldsnap.tiny_models import build_model

    arch, size, tied = ENTRIES.get(entry) or ENTRIES["llama"]
    t = time.perf_counter()
    info = build_model(models / entry, arch, size, 0, tied=tied)
    extra: dict[str, Any] = {}
    if "draft" in BEHAVIOURS.get(entry, {}):
        d_arch, d_size = BEHAVIOURS[entry]["draft"]
        draft = build_model(models / f"{entry}-draft", d_arch, d_size, 1)
        extra = {"draft_path": str(draft.path), "draft_class": draft.architecture,
                 "draft_size": d_size, "draft_parameters": draft.num_parameters}  # fmt: skip
    cfg = json.loads((info.path / "config.json").read_text())
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return {
        "path": str(info.path),
        "arch": arch,
        "size": size,
        "tied": info.tied,
        "class": info.architecture,
        "head_size": head,
        "parameters": info.num_parameters,
        "build_s": round(time.perf_counter() - t, 1),
        **extra,
    }


def run_one(args: argparse.Namespace) -> int:
    """--one ENTRY: the whole sequence of one architecture, in this process."""
    from coldsnap.backends import become_subreaper

    become_subreaper()  # restored trees are adopted here, and reaped before the next restore
    entry = args.one
    if BEHAVIOURS.get(entry, {}).get("stubs"):  # every engine of this entry inherits them
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE / "stubs"), os.environ.get("PYTHONPATH")) if p
        )
        os.environ["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    out, root = args.out / entry, args.root / entry
    shutil.rmtree(root, ignore_errors=True)  # an earlier call's capsules (models are kept)
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    model = build_entry(entry, args.root / "models")
    run_args = argparse.Namespace(
        out=out, root=root, model=Path(model["path"]), size=entry,
        budget=args.deadline - time.time(), cold_s=args.cold_s, naive=False,
        variants=args.variants, restores=args.restores, cli_restores=args.cli_restores,
        mem_frac=args.mem_frac, cold_json=args.root / "cold" / f"{entry}.json",
    )  # fmt: skip
    run_args.cold_json.parent.mkdir(parents=True, exist_ok=True)
    run = ArchRun(run_args, entry)
    run.results["model"] = model
    run.save()
    try:
        run.results["cold"] = run.cold_once()  # kept by an earlier call on this machine
        run.log("cold start to first answer", run.results["cold"]["first_answer_s"], "s")
    except Exception:
        run.results["cold"] = {"error": traceback.format_exc()}
        run.log("cold start failed", run.results["cold"]["error"])
    run.save()
    cold = run.results["cold"].get("answers")
    for variant in args.variants:
        var: dict[str, Any] = {}
        run.results["variants"][variant] = var
        if run.left() < args.capture_s:
            var["skipped"] = f"budget: {run.left():.0f} s left"
            continue
        try:
            var["capture"] = cli_capture(run) if variant == CLI else run.capture(variant)
        except Exception:
            var["capture"] = {"error": traceback.format_exc()}
        run.log(variant, "capture", var["capture"].get("outcome"), var["capture"].get("error"))
        run.save()
        if var["capture"].get("outcome") != "done":
            continue
        var["restores"] = []
        for i in range(args.restores):
            if run.left() < args.restore_s:
                var["restores"].append({"skipped": f"budget: {run.left():.0f} s left"})
                continue
            try:
                if variant == CLI:  # timed from the command's spawn to the first answer
                    r = run.cli_restore(CLI, i, cold)
                else:
                    r = run.restore(variant, i, cold)
            except Exception:
                r = {"error": traceback.format_exc()}
            var["restores"].append(r)
            run.log(variant, f"restore{i}", r.get("outcome"), r.get("first_answer_s"),
                    r.get("equal"), r.get("error") or r.get("answer_error") or "")  # fmt: skip
            run.save()
        for i in range(args.cli_restores if variant != CLI else 0):
            if run.left() < args.restore_s + 15:
                var.setdefault("cli_restores", []).append({"skipped": "budget"})
                continue
            try:
                r = run.cli_restore(variant, i, cold)
            except Exception:
                r = {"error": traceback.format_exc()}
            var.setdefault("cli_restores", []).append(r)
            run.save()
        var["dropped"] = drop_capsule(run, variant)
        run.save()
    run.results["done"] = True
    run.save()
    copy_logs(root, out / "logs")
    return 0


def cli_argv(run: ArchRun, *extra: str) -> list[str]:
    """`coldsnap capture` of the plain launch command an operator would type (SGLang's own
    flags only: the command line adds coldsnap's), the capsule named "cli" in the run's store."""
    cli = [sys.executable, "-m", "coldsnap.cli", "capture", *extra, "--name", CLI]
    launch = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(run.args.model),
              *sm.ENGINE_ARGS]  # fmt: skip
    return [*cli, "--store", str(run.root / "store"), "--", *launch]


def cli_capture(run: ArchRun) -> dict[str, Any]:
    """The capture through the command line; its summary line (outcome, error) is the record."""
    argv = cli_argv(run)
    (run.root / CLI).mkdir(parents=True, exist_ok=True)  # the CLI restores' workdirs go here
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          timeout=max(run.left() - 10, 30))  # fmt: skip
    rec: dict[str, Any] = {"argv": argv, "rc": done.returncode,
                           "wall_s": round(time.perf_counter() - t0, 3)}  # fmt: skip
    try:
        summary = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        summary = {}
    if not isinstance(summary, dict) or "outcome" not in summary:
        summary = {"outcome": f"exit {done.returncode}", "error": done.stderr[-3000:]}
    rec.update(outcome=summary["outcome"], error=summary.get("error"),
               workdir=summary.get("workdir"), receipt_s=summary.get("seconds"))  # fmt: skip
    if done.returncode != 0:
        rec["stderr"] = done.stderr[-3000:]
    return rec


def drop_capsule(run: ArchRun, name: str) -> dict[str, Any]:
    """`coldsnap rm` of a variant's capsule once its restores are done: the device's disk holds
    a few of the 4-5 GB images at a time, not every architecture's every variant."""
    argv = [sys.executable, "-m", "coldsnap.cli", "rm", name, "--store", str(run.root / "store")]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    free = shutil.disk_usage(run.root)
    return {"rc": done.returncode, "said": (done.stdout + done.stderr)[-500:],
            "disk_free_gib": round(free.free / 2**30, 1)}  # fmt: skip


def copy_logs(root: Path, dest: Path, tail: int = 300_000) -> None:
    """The engines' logs and the receipts under `root`, flat (deep folders do not come back from
    the device), each log's tail only (what comes back is limited)."""
    for path in [*root.glob("**/*.log"), *root.glob("**/receipt.json")]:
        target = dest / "__".join(path.relative_to(root).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.write_bytes(path.read_bytes()[-tail:])
        except OSError as exc:
            target.with_suffix(".unreadable").write_text(str(exc))


# -- the matrix -----------------------------------------------------------------------------------


class Matrix:
    """Runs the entries as child processes, `--jobs` at a time, within the budget."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = time.time() + args.budget
        self.results: dict[str, Any] = {
            "command": os.environ.get("MATRIX_COMMAND") or shlex.join(sys.argv),
            "engine_args": list(sm.ENGINE_ARGS),
            "variants": list(args.variants),
            "plan": {entry: list(vs) for entry, vs in args.plan.items()},
            "jobs": args.jobs,
            "prompts": sm.PROMPTS,
            "new_tokens": sm.NEW_TOKENS,
            "entries": {},
            "coldsnap_from": _coldsnap_from(),
        }

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, *parts: Any) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s]", *parts, flush=True)

    def child_argv(self, entry: str) -> list[str]:
        a = self.args
        return [
            sys.executable, "-P", __file__, "--one", entry, "--out", str(a.out),
            "--root", str(a.root), "--deadline", str(self.deadline),
            "--variants", ",".join(a.plan[entry]), "--restores", str(a.restores),
            "--cli-restores", str(a.cli_restores), "--mem-frac", a.mem_frac,
            "--max-tokens", str(a.max_tokens),
            "--cold-s", str(a.cold_s), "--capture-s", str(a.capture_s),
            "--restore-s", str(a.restore_s),
            *(["--engine-args", a.engine_args] if a.engine_args is not None else []),
        ]  # fmt: skip

    def collect(self, entry: str, note: str | None = None) -> None:
        path = self.args.out / entry / "result.json"
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            rec = {"error": f"no result: {exc}"}
        if note:
            rec["cut"] = note
        self.results["entries"][entry] = rec
        self.save()

    def save(self) -> None:
        self.results["rows"] = rows(self.results)
        path = self.args.out / "matrix.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(path)
        (self.args.out / "matrix.md").write_text(table(self.results["rows"]))

    def main(self) -> int:
        from coldsnap.backends.procs import kill_tree

        pending = list(self.args.archs)
        running: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}
        while pending or running:
            while pending and len(running) < self.args.jobs:
                entry = pending.pop(0)
                if self.left() < self.args.arch_s:
                    self.results["entries"][entry] = {"skipped": f"budget: {self.left():.0f} s"}
                    self.log(entry, "skipped:", f"{self.left():.0f} s left")
                    continue
                (self.args.out / entry).mkdir(parents=True, exist_ok=True)
                log = open(self.args.out / entry / "run.log", "wb")  # noqa: SIM115 (closed below)
                proc = subprocess.Popen(
                    self.child_argv(entry), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
                running[entry] = (proc, log)
                self.log(entry, "started", f"pid {proc.pid}")
            for entry, (proc, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[entry]
                self.collect(entry)
                self.log(entry, "ended", f"rc {proc.returncode};", _brief(self.results, entry))
            if running and self.left() < 5:
                for entry, (proc, log) in running.items():
                    kill_tree(proc.pid)
                    log.close()
                    copy_logs(self.args.root / entry, self.args.out / entry / "logs")
                    self.collect(entry, note=f"stopped at the budget ({self.args.budget:.0f} s)")
                    self.log(entry, "stopped at the budget")
                running.clear()
            time.sleep(1.0)
        self.save()
        print(table(self.results["rows"]), flush=True)
        return 0

    def dry(self) -> int:
        """On CPU: every entry's model built, every request and launch command validated."""
        from coldsnap import Machine, RefusedError
        from coldsnap.engines.sglang import build
        from coldsnap.machine import WeightSource

        checks: dict[str, Any] = {}
        self.log("coldsnap from", self.results["coldsnap_from"])
        for entry in self.args.archs:
            model = build_entry(entry, self.args.root / "models")
            run_args = argparse.Namespace(
                out=self.args.out / entry, root=self.args.root / entry,
                model=Path(model["path"]), size=entry, budget=self.args.budget,
            )  # fmt: skip
            run = ArchRun(run_args, entry)
            run.results["model"] = model
            run_args.root.mkdir(parents=True, exist_ok=True)  # the command line's store's parent
            rec: dict[str, Any] = {"model": model, "variants": {}}
            for variant in self.args.plan[entry]:
                if variant == CLI:  # the command line prints the request it would run
                    argv = cli_argv(run, "--print-request")
                    done = subprocess.run(argv, capture_output=True, text=True, check=False)
                    if done.returncode != 0:
                        raise RuntimeError(f"{shlex.join(argv)}: {done.stderr[-2000:]}")
                    rec["variants"][variant] = {"argv": argv, "request": json.loads(done.stdout)}
                    continue
                capture = run.capture_request(variant)
                restore = run.restore_request(variant, 0)
                try:
                    machine = Machine.for_request(capture)
                    Machine.for_request(restore)
                except RefusedError as exc:  # a CUDA-only behaviour on this CPU host
                    rec["variants"][variant] = {"refused_here": str(exc)}
                    self.log(entry, variant, "refused on this host:", exc)
                    continue
                command = build(capture).launcher.command(
                    capture, Path(capture.workdir), weights=WeightSource(source="payload")
                )
                rec["variants"][variant] = {
                    "components": sorted(type(c).__name__ for c in machine.components.values()),
                    "argv": command.argv,
                }
            checks[entry] = rec
            self.log(entry, model["class"], f"head {model['head_size']}", f"tied {model['tied']}",
                     f"{model['parameters']} parameters", "requests ok")  # fmt: skip
        self.results["dry"] = checks
        self.save()
        return 0


def _coldsnap_from() -> str:
    """Where this process imports coldsnap from: the harness, its engines and the CLI must all
    import the tree under test."""
    import coldsnap

    return str(Path(coldsnap.__file__).resolve().parent)


# -- the table ------------------------------------------------------------------------------------


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per architecture and variant, in the shape docs/qualification.md uses."""
    out = []
    command = results.get("command", "")
    for entry, rec in results.get("entries", {}).items():
        model = rec.get("model") or {}
        what = f"{entry} ({model.get('class', '?')}, {model.get('size', '?')}"
        what += f", head {model.get('head_size', '?')}{', tied' if model.get('tied') else ''})"
        cold = rec.get("cold") or {}
        cold_s = cold.get("first_answer_s")
        if "skipped" in rec or ("error" in rec and not rec.get("variants")):
            reason = rec.get("skipped") or _last_line(rec.get("error"))
            out.append(_row(what, "-", f"not run: {reason}", [], cold_s, command))
            continue
        if "error" in cold:
            why = _last_line(cold["error"])
            out.append(_row(what, "-", f"cold start failed: {why}", [], None, command))
        for variant, var in (rec.get("variants") or {}).items():
            out.append(_row(what, variant, _answers(var, rec.get("cut")),
                            _restore_seconds(var), cold_s, command))  # fmt: skip
        if not rec.get("variants") and rec.get("cut"):
            out.append(_row(what, "-", rec["cut"], [], cold_s, command))
    return out


def _row(what: str, variant: str, answers: str, restore_s: list[float], cold_s: Any,
         command: str) -> dict[str, Any]:  # fmt: skip
    return {"architecture": what, "variant": variant, "answers": answers,
            "restore_s": restore_s, "cold_s": cold_s, "command": command}  # fmt: skip


def _answers(var: dict[str, Any], cut: str | None) -> str:
    if "skipped" in var:
        return f"not run: {var['skipped']}"
    if "capture" not in var:
        return f"capture not finished: {cut or 'the run ended'}"
    cap = var["capture"]
    if cap.get("outcome") != "done":
        return f"refused: {(_last_line(cap.get('error')) or str(cap.get('outcome')))[:300]}"
    parts = []
    for r in (var.get("restores") or []) + (var.get("cli_restores") or []):
        if "skipped" in r:
            parts.append(f"not run ({r['skipped']})")
        elif r.get("equal"):
            parts.append(f"exact {sum(r['equal'].values())}/{len(r['equal'])}")
        elif r.get("outcome") == "done" and not r.get("answer_error"):
            parts.append("answered, no cold answers to compare")
        else:
            why = r.get("error") or r.get("answer_error") or r.get("outcome")
            parts.append(f"restore failed: {_last_line(why)[:200]}")
    if cut:
        parts.append(cut)
    return ", ".join(parts) or "no restore"


def _restore_seconds(var: dict[str, Any]) -> list[float]:
    return [r["first_answer_s"] for r in var.get("restores") or [] if r.get("first_answer_s")]


def _last_line(text: Any) -> str:
    lines = [x for x in str(text or "").strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else ""


def _brief(results: dict[str, Any], entry: str) -> str:
    return "; ".join(
        f"{r['variant']}: {r['answers']}" for r in rows(results) if r["architecture"].startswith(
            f"{entry} (")
    )  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| architecture | driver / provider | answers | restore s | cold s | command |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        variant = r["variant"].replace("-", " / ", 1) if r["variant"] != "-" else "-"
        restore = ", ".join(f"{s:.2f}" for s in r["restore_s"]) or "-"
        cold = f"{r['cold_s']:.1f}" if isinstance(r["cold_s"], (int, float)) else "-"
        answers = r["answers"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['architecture']} | {variant} | {answers} | {restore} | {cold} | "
                     f"`{r['command']}` |")  # fmt: skip
    return "\n".join(lines) + "\n"


# -- arguments ------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split = lambda s: tuple(x for x in s.split(",") if x)  # noqa: E731
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("/var/tmp/coldsnap-matrix"))
    p.add_argument("--archs", type=split, default=tuple(ENTRIES),
                   help="comma-separated, of: " + ", ".join([*ENTRIES, *BEHAVIOURS])
                   + "; ENTRY:V1+V2 runs that entry's own variants")  # fmt: skip
    p.add_argument("--variants", type=split, default=("n610-native",),
                   help="comma-separated, of: " + ", ".join(VARIANTS))  # fmt: skip
    p.add_argument("--restores", type=int, default=2)
    p.add_argument("--cli-restores", type=int, default=0, help="more, by `coldsnap restore`")
    p.add_argument("--jobs", type=int, default=4, help="architectures side by side")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    p.add_argument("--arch-s", type=float, default=170.0, help="least time to start an arch")
    p.add_argument("--cold-s", type=float, default=300.0, help="most time for a cold start")
    p.add_argument("--capture-s", type=float, default=90.0, help="least time to start a capture")
    p.add_argument("--restore-s", type=float, default=25.0, help="least time to start a restore")
    p.add_argument(
        "--mem-frac", default="0.5",
        help="--mem-fraction-static of every server. SGLang 0.5.17 sizes the KV cache as the "
        "memory free after loading less (1 - this) x the memory free before: servers starting "
        "side by side allocate in between, and at 0.05 or 0.1 later ones found none left. At "
        "0.5 the slack holds; --max-tokens keeps each cache small",
    )  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=16384,
                   help="--max-total-tokens of every server (caps its KV cache)")  # fmt: skip
    p.add_argument(
        "--engine-args",
        help="the engines' flags, one string, instead of sglang_machine's GPU flags and "
        '--mem-frac ("" on a CPU host: the adapter\'s own CPU flags)',
    )
    p.add_argument("--dry", action="store_true", help="no GPU: build, validate, launch nothing")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.plan = {}
    for item in args.archs:
        entry, _, own = item.partition(":")
        args.plan[entry] = tuple(own.split("+")) if own else args.variants
    args.archs = tuple(args.plan)
    bad = [x for x in args.archs if x not in ENTRIES and x not in BEHAVIOURS]
    bad += [v for vs in args.plan.values() for v in vs if v not in VARIANTS]
    if bad:
        p.error(f"unknown: {', '.join(bad)} (archs: {', '.join(ENTRIES)}; "
                f"variants: {', '.join(VARIANTS)})")  # fmt: skip
    if args.restores < 1 or args.jobs < 1:
        p.error("--restores and --jobs: at least 1")
    if args.one and args.deadline is None:
        p.error("--one needs --deadline")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.engine_args is None:
        sm.ENGINE_ARGS = (*sm.BASE_ARGS, "--mem-fraction-static", args.mem_frac,
                          "--max-total-tokens", str(args.max_tokens))  # fmt: skip
    else:
        sm.ENGINE_ARGS = tuple(shlex.split(args.engine_args))
    args.out.mkdir(parents=True, exist_ok=True)
    args.root.mkdir(parents=True, exist_ok=True)
    if args.one:
        return run_one(args)
    if args.dry:
        return Matrix(args).dry()
    return Matrix(args).main()


if __name__ == "__main__":
    raise SystemExit(main())
