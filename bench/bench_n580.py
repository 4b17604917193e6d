"""Where an n580 restore's time goes: a real SGLang server on CPU, captured with n580,
restored `--runs` times, each restore timed step by step (the receipt) and inside
`release_template` / `wait_healthy` by the engine's own log (each line stamped when it appears),
against a cold start in every round (interleaved, medians).

    .venv/bin/python bench/bench_n580.py [--runs 3] [--provider native] [--keep]
                                         [--compare-warmup]

The cold start and the restore are timed as bench/bench_e2e.py times them (coldsnap.cli._demo:
launch to the first greedy answer; restore start to the first answer equal to the cold one).
Capture is timed from its start to its receipt, beside an untimed-warm-up cold start.
`--compare-warmup` adds, in every round, a restore whose engine runs SGLang's server warmup
(`SGLangLauncher.restore_args` emptied in this process: the behaviour before it skipped it).
SGLang's log has one-second timestamps, so lines are stamped by a reader thread that polls the
log every 5 ms; a phase is the offset of its first matching line from the restore's start.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import at_least_one, capture_request, host_problem, load, tiny_llama, work_dir

from coldsnap.cli._demo import DemoError, capture, cold_start, restore_to_first_answer
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.machine import ModelRef, RestoreRequest

# (label, regular expression) in the order SGLang reaches them; the first match counts.
MARKERS: tuple[tuple[str, str], ...] = (
    ("engine args parsed", r"server_args=ServerArgs"),
    ("torch distributed", r"Init torch distributed begin"),
    ("load weights begin", r"Load weight begin"),
    ("load weights end", r"Load weight end"),
    ("KV pool allocated", r"Memory pool end|KV Cache is allocated"),
    ("scheduler ready", r"max_total_num_tokens="),
    ("HTTP process up", r"Started server process"),
    ("uvicorn listening", r"Uvicorn running"),
    ("warmup /model_info", r"GET /model_info"),
    ("first /generate done", r"POST /generate"),
    ("fired up (warmup done)", r"fired up and ready to roll"),
    ("/ready 200", r"GET /ready HTTP/1.1\" 200"),
)


class _LogStamps(threading.Thread):
    """Stamps each new line of a growing log with the seconds since `started`."""

    def __init__(self, path: Path, started: float) -> None:
        super().__init__(daemon=True)
        self.path, self.started = path, started
        self.lines: list[tuple[float, str]] = []
        self._done = threading.Event()

    def run(self) -> None:
        offset, pending = 0, ""
        while True:
            stopping = self._done.is_set()
            try:
                with self.path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                chunk = b""
            if chunk:
                offset += len(chunk)
                now = time.perf_counter() - self.started
                text = pending + chunk.decode(errors="replace").replace("\r", "\n")
                *done, pending = text.split("\n")
                self.lines += [(now, line) for line in done if line]
            if stopping:
                return
            time.sleep(0.005)

    def finish(self) -> list[tuple[float, str]]:
        self._done.set()
        self.join()
        return self.lines


def phases(lines: list[tuple[float, str]]) -> dict[str, float]:
    """The first stamp of each marker found in `lines`."""
    found: dict[str, float] = {}
    for label, pattern in MARKERS:
        regex = re.compile(pattern)
        for stamp, line in lines:
            if regex.search(line):
                found[label] = stamp
                break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed rounds (after one warm-up)")
    parser.add_argument("--provider", default="native", choices=("native", "recovery"))
    parser.add_argument("--keep", action="store_true", help="keep the work dir and its logs")
    parser.add_argument(
        "--compare-warmup", action="store_true", help="also restore with SGLang's server warmup"
    )
    args = parser.parse_args()
    at_least_one(parser, "--runs", args.runs)
    if host_problem("bench_n580"):
        return 2
    with work_dir("bench_n580", keep=args.keep) as root:
        info, model = tiny_llama(root)
        reference = cold_start(info.path, root / "cold-ref.log")
        print(f"reference cold start (warm-up): {reference.seconds:.2f} s")
        started = time.perf_counter()
        receipt = capture(capture_request(root, model, "n580", args.provider, "n580"))
        captured = time.perf_counter() - started
        print(
            f"capture {captured:.2f} s ({captured / reference.seconds:.2f}x the warm-up cold "
            f"start); image {receipt.facts.get('image_bytes', 0) / 1e6:.0f} MB; steps: "
            + _steps(receipt.timings())
        )
        variants = ("n580", "n580+warmup") if args.compare_warmup else ("n580",)
        for variant in variants:
            _restore(root, model, args.provider, f"first-{variant}", reference.tokens, variant)
        rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for run in range(args.runs):
            load_now = load()
            cold = cold_start(info.path, root / f"cold-{run}.log")
            if cold.tokens != reference.tokens:
                raise DemoError(f"cold starts disagree: {cold.tokens}")
            order = variants if run % 2 == 0 else variants[::-1]
            for variant in order:
                row = _restore(root, model, args.provider, f"{run}-{variant}", reference.tokens,
                               variant)  # fmt: skip
                row.update(cold=cold.seconds, load=load_now)
                rows[variant].append(row)
            print(
                f"  run {run}: cold {cold.seconds:6.2f} s  "
                + "  ".join(f"{v} {rows[v][-1]['seconds']:5.2f} s" for v in variants)
                + f"  (load {load_now})"
            )
        for variant in variants:
            _report(variant, rows[variant], captured)
        print(f"load average at end {load()}")
    return 0


def _restore(
    root: Path, model: ModelRef, provider: str, tag: str, expected: tuple[int, ...], variant: str
) -> dict[str, Any]:
    workdir = root / f"restore-{tag}"
    request = RestoreRequest(
        driver="n580",
        provider=provider,
        model=model,
        engine="sglang",
        artifact="n580",
        workdir=str(workdir),
        store=str(root / "store"),
    )
    default = SGLangLauncher.restore_args
    if variant.endswith("+warmup"):
        SGLangLauncher.restore_args = ()
    stamps = _LogStamps(workdir / "engine.log", time.perf_counter())
    stamps.start()
    try:
        answer, receipt, machine = restore_to_first_answer(request, expected)
    finally:
        lines = stamps.finish()
        SGLangLauncher.restore_args = default
    machine.stop(receipt)
    steps = receipt.timings()
    # where release_template starts, counted from the restore's start (steps run in order)
    names = list(steps)
    before = sum(steps[n] for n in names[: names.index("release_template")])
    return {"seconds": answer.seconds, "steps": steps, "phases": phases(lines), "release": before}


def _report(variant: str, rows: list[dict[str, Any]], captured: float) -> None:
    cold = statistics.median(r["cold"] for r in rows)
    restore = statistics.median(r["seconds"] for r in rows)
    print()
    spread = f"{min(r['seconds'] for r in rows):.2f}-{max(r['seconds'] for r in rows):.2f}"
    print(
        f"{variant}: cold start median {cold:.2f} s; restore median {restore:.2f} s ({spread}); "
        f"ratio {cold / restore:.1f}x; capture {captured:.2f} s = {captured / cold:.2f}x cold"
    )
    steps: dict[str, list[float]] = {}
    for row in rows:
        for name, seconds in row["steps"].items():
            steps.setdefault(name, []).append(seconds)
    print("restore steps, medians: " + _steps({n: statistics.median(v) for n, v in steps.items()}))
    print(
        "engine log, seconds from the restore's start (medians; release_template starts at "
        f"{statistics.median(r['release'] for r in rows):.2f}):"
    )
    for label, _ in MARKERS:
        stamps = [r["phases"][label] for r in rows if label in r["phases"]]
        if stamps:
            print(
                f"  {label:24} {statistics.median(stamps):6.2f}  (in {len(stamps)} of {len(rows)})"
            )


def _steps(timings: dict[str, float]) -> str:
    return ", ".join(f"{n} {s:.2f}" for n, s in timings.items() if s > 0.01)


if __name__ == "__main__":
    sys.exit(main())
