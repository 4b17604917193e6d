"""A restore from a fresh orchestrator process (`coldsnap restore NAME`, a new process each
time) to its first answer, side by side with the same restore in a warm process, against the
goal: the fresh process within the in-process time plus 0.5 s on CPU.

    .venv/bin/python bench/bench_cli_restore.py [--runs 3] [--json OUT]

- cold: a plain SGLang server, launch to its first greedy answer (once, the reference answer).
- in-process: Machine.restore in this (warm) process, to the first answer.
- cli: `coldsnap restore` in a new process, from its spawn to the first answer; the receipt's
  `admit` step (where the engine's build is checked) and the command's time outside the
  receipt (interpreter start, imports, Machine.for_request) are printed beside it.
Each run takes one of each, in turn, so both see the same machine; the load average is printed
with every run. Needs root (CRIU) and a host `coldsnap doctor` passes; the capture and the
stops are not timed.

coldsnap's bytecode is compiled before the timed runs, as installing the package does (pip
writes it at install). A checkout run with PYTHONDONTWRITEBYTECODE=1 has none and would compile
every coldsnap module from source at each start (0.15-0.2 s here), which no operator pays;
--no-bytecode leaves it out to see that case.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

import psutil
from _common import at_least_one, capture_request, host_problem, load, tiny_llama, work_dir

import coldsnap
from coldsnap.cli._demo import (
    DemoError,
    capture,
    cold_start,
    first_answer,
    restore_to_first_answer,
)
from coldsnap.engines.sglang import free_port
from coldsnap.machine import ModelRef, RestoreRequest

COLDSNAP = Path(sys.executable).with_name("coldsnap")
GOAL_MARGIN_S = 0.5
"""On CPU a fresh `coldsnap restore` may take this much longer than the in-process restore
(a Python process with the command line's libraries costs 0.2-0.4 s to start)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each kind")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="leave coldsnap's bytecode as it is (a checkout may have none)",
    )
    args = parser.parse_args()
    at_least_one(parser, "--runs", args.runs)
    if host_problem("bench_cli_restore"):
        return 2
    if not args.no_bytecode:
        _compile_bytecode()
    rows: list[dict[str, Any]] = []
    with work_dir("bench_cli_restore") as root:
        store = root / "store"
        info, model = tiny_llama(root)
        reference = cold_start(info.path, root / "logs" / "cold-ref.log")
        capture(capture_request(root, model, "n610", "native", "tiny"))
        _in_process(root, model, "warmup", reference.tokens)
        for run in range(args.runs):
            row: dict[str, Any] = {"run": run, "load": os.getloadavg()[0]}
            row["in-process"], row["in-process-steps"] = _in_process(
                root, model, str(run), reference.tokens
            )
            row["cli"] = _cli_restore(root, store, f"cli-{run}", reference.tokens)
            rows.append(row)
            cli = row["cli"]
            print(
                f"run {run} (load {load()}): in-process {row['in-process']:.2f} s, cli "
                f"{cli['seconds']:.2f} s (admit {cli['admit']:.2f} s, outside the receipt "
                f"{cli['outside_receipt']:.2f} s)"
            )
        _report(rows, reference.seconds)
        if args.json:
            args.json.write_text(json.dumps({"cold": reference.seconds, "runs": rows}, indent=1))
    return 0


def _compile_bytecode() -> None:
    """coldsnap's modules compiled to bytecode beside them, as an install leaves them; stale
    files are rewritten, fresh ones kept (compileall compares the source's stamp)."""
    package = Path(coldsnap.__file__).parent
    if not compileall.compile_dir(package, quiet=1):
        raise DemoError(f"compiling {package} to bytecode failed")
    print(f"coldsnap's bytecode compiled under {package}, as an install leaves it")


def _in_process(
    root: Path, model: ModelRef, tag: str, expected: tuple[int, ...]
) -> tuple[float, dict[str, float]]:
    """The restore in this process to its first answer, and its steps' seconds."""
    request = RestoreRequest(
        driver="n610",
        provider="native",
        model=model,
        engine="sglang",
        artifact="tiny",
        workdir=str(root / f"restore-{tag}"),
        store=str(root / "store"),
    )
    answer, receipt, machine = restore_to_first_answer(request, expected)
    tree = _tree(receipt.facts.get("engine_pid"))
    machine.stop(receipt)
    _wait_gone(tree)
    return answer.seconds, receipt.timings()


def _cli_restore(root: Path, store: Path, tag: str, expected: tuple[int, ...]) -> dict[str, Any]:
    """`coldsnap restore` in a new process, timed from its spawn to the first answer."""
    workdir = root / f"restore-{tag}"
    argv = [
        str(COLDSNAP),
        "restore",
        "tiny",
        "--store",
        str(store),
        "--workdir",
        str(workdir),
        "--port",
        str(free_port()),
        "--serve-as",
        tag,
        "--json",
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    command_s = time.perf_counter() - started
    last: dict[str, Any] = {}
    try:
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        last = events[-1] if events else {}
        if done.returncode != 0 or last.get("status") != "done":
            raise DemoError(f"{' '.join(argv)}: rc {done.returncode}\n{done.stderr[-3000:]}")
        tokens = first_answer(last["result"]["url"])
        seconds = time.perf_counter() - started
    finally:
        tree = _tree((last.get("result") or {}).get("pid"))
        subprocess.run([str(COLDSNAP), "stop", tag], capture_output=True, check=False)
        _wait_gone(tree)  # the next restore takes the image's PIDs back
    if tokens != tuple(expected):
        raise DemoError(f"{tag}: the restore answered {list(tokens)}, the cold start {expected}")
    timings = last["result"]["timings"]
    return {
        "seconds": seconds,
        "command": command_s,
        "receipt": last["seconds"],
        "outside_receipt": command_s - last["seconds"],
        "admit": timings.get("admit", 0.0),
        "steps": timings,
    }


def _tree(pid: int | None) -> list[int]:
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root.pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.Error:
        return []


def _wait_gone(pids: list[int], timeout: float = 60.0) -> None:
    """Until none of `pids` is held, zombies included. The in-process restores make this
    process a subreaper, so the CLI's orphaned engines end as its children: reaped here."""
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(p) for p in pids):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if time.monotonic() > deadline:
            raise DemoError(f"the stopped engine's processes {pids} are still there")
        time.sleep(0.1)


def _report(rows: list[dict[str, Any]], cold: float) -> None:
    inproc = statistics.median(r["in-process"] for r in rows)
    cli = statistics.median(r["cli"]["seconds"] for r in rows)
    admit = statistics.median(r["cli"]["admit"] for r in rows)
    outside = statistics.median(r["cli"]["outside_receipt"] for r in rows)
    goal = inproc + GOAL_MARGIN_S
    print(f"\nmedians over {len(rows)} runs (load at the end {load()}; {os.cpu_count()} cpus):")
    print(f"  cold start {cold:.2f} s (once, the reference answer)")
    print(f"  in-process restore {inproc:.2f} s to the first answer")
    print(
        f"  fresh `coldsnap restore` {cli:.2f} s to the first answer (admit {admit:.2f} s, "
        f"outside the receipt {outside:.2f} s): x{cli / inproc:.2f} the in-process restore, "
        f"+{cli - inproc:.2f} s"
    )
    verdict = "met" if cli <= goal else "NOT met"
    print(f"  goal: fresh <= in-process + {GOAL_MARGIN_S} s = {goal:.2f} s: {verdict}")
    for label, key in (
        ("cli", lambda r: r["cli"]["steps"]),
        ("in-process", itemgetter("in-process-steps")),
    ):
        steps: dict[str, list[float]] = {}
        for r in rows:
            for name, sec in key(r).items():
                steps.setdefault(name, []).append(sec)
        print(
            f"  {label} steps over 50 ms, medians: "
            + ", ".join(
                f"{k} {statistics.median(v):.2f}"
                for k, v in steps.items()
                if statistics.median(v) > 0.05
            )
        )


if __name__ == "__main__":
    sys.exit(main())
