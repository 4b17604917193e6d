"""Issue 6's benchmark: a real SGLang server restored from a capsule against a cold start, same
model, same run, side by side. Prints the ratio of medians and the absolute seconds.

    .venv/bin/python bench/bench_e2e.py [--runs 5] [--size tiny] [--provider native]
                                        [--no-drop-caches] [--json OUT]

- cold: a plain `python -m sglang.launch_server` (coldsnap's plugin not loaded), from launch
  to its first greedy answer (/generate polled directly: SGLang's /health sleeps a second).
- P1: an n610 restore (Machine.restore: admit, stage, CRIU restore, hydrate, health, acceptance)
  to the first answer that equals the cold one token for token.
  Admit verifies every block of the process image; its seconds (`verify_image_seconds`) are
  printed beside each restore and as a share of the restore time.
- P2: the same for n580 (template restore + release + engine construction).
Each round runs one of each, interleaved, so the machine's noise hits all three alike; a round
is repeated with a warm page cache and after `sync; echo 3 > /proc/sys/vm/drop_caches` before
each timed run. Captures, stops and the first (warm-up) round are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import at_least_one, capture_request, host_problem, load, tiny_llama, work_dir

from coldsnap.cli._demo import (
    DemoError,
    capture,
    cold_start,
    restore_to_first_answer,
)
from coldsnap.machine import ModelRef, RestoreRequest

DRIVERS = ("n610", "n580")


def drop_caches() -> str | None:
    """Drops the page cache (root only); returns why it could not, or None."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"cannot drop caches: {exc}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed rounds per cache condition")
    parser.add_argument("--size", default="tiny", choices=("tiny", "small"))
    parser.add_argument("--provider", default="native", choices=("native", "recovery"))
    parser.add_argument("--no-drop-caches", action="store_true")
    parser.add_argument(
        "--drivers", default=",".join(DRIVERS), help="comma-separated subset of n610,n580"
    )
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args()
    at_least_one(parser, "--runs", args.runs)
    drivers = tuple(d for d in args.drivers.split(",") if d)
    if not drivers or set(drivers) - set(DRIVERS):
        parser.error(f"--drivers: {args.drivers!r} is not a subset of {','.join(DRIVERS)}")

    if host_problem("bench_e2e"):
        return 2
    with work_dir("bench_e2e") as root:
        print(f"code: {_revision()}")
        results: dict[str, Any] = {"load_start": os.getloadavg(), "runs": args.runs, "rows": []}
        info, model = tiny_llama(root, args.size)
        print(f"model: llama {args.size}, {info.weight_bytes / 1e6:.1f} MB of bf16 weights")
        reference = cold_start(info.path, root / "logs" / "cold-ref.log")
        print(f"reference cold start (untimed warm-up): {reference.seconds:.2f} s")
        for driver in drivers:
            request = capture_request(
                root, model, driver, args.provider, driver, workdir=f"capture-{driver}"
            )
            started = time.perf_counter()
            receipt = capture(request)
            facts = receipt.facts
            print(
                f"captured {driver}/{args.provider} in {time.perf_counter() - started:.1f} s: "
                f"image {facts.get('image_bytes', 0) / 1e6:.1f} MB, capsule "
                f"{facts.get('capsule_bytes', 0) / 1e6:.1f} MB"
            )
            results[f"capture_{driver}"] = {
                "seconds": receipt.seconds,
                "image_bytes": facts.get("image_bytes"),
                "capsule_bytes": facts.get("capsule_bytes"),
            }
            _restore(root, model, driver, args.provider, "warmup", reference.tokens)

        conditions = [("warm", False)]
        if not args.no_drop_caches:
            why = drop_caches()
            if why:
                print(f"dropped caches: skipped ({why})")
            else:
                conditions.append(("dropped", True))
        for condition, drop in conditions:
            for run in range(args.runs):
                row: dict[str, Any] = {"condition": condition, "run": run, "load": load()}
                if drop:
                    drop_caches()
                row["cold"] = cold_start(info.path, root / "logs" / f"cold-{condition}-{run}.log")
                if row["cold"].tokens != reference.tokens:
                    raise DemoError(f"cold starts disagree: {row['cold'].tokens}")
                for driver in drivers:
                    if drop:
                        drop_caches()
                    row[driver] = _restore(
                        root, model, driver, args.provider, f"{condition}-{run}", reference.tokens
                    )
                results["rows"].append(row)
                print(
                    f"  {condition:7} run {run}: cold {row['cold'].seconds:6.2f} s  "
                    + "  ".join(
                        f"{d} {row[d]['seconds']:5.2f} s "
                        f"(verify image {row[d]['verify_image']:.3f} s)"
                        for d in drivers
                    )
                    + f"  (load {row['load']})"
                )
        _report(results, conditions, drivers)
        results["load_end"] = os.getloadavg()
        print(f"load average at end {load()}")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=_plain))
    return 0


def _restore(
    root: Path, model: ModelRef, driver: str, provider: str, tag: str, expected: tuple[int, ...]
) -> dict[str, Any]:
    request = RestoreRequest(
        driver=driver,
        provider=provider,
        model=model,
        engine="sglang",
        artifact=driver,
        workdir=str(root / f"restore-{driver}-{tag}"),
        store=str(root / "store"),
    )
    answer, receipt, machine = restore_to_first_answer(request, expected)
    machine.stop(receipt)
    shutil.rmtree(request.workdir, ignore_errors=True)
    verify = receipt.facts.get("verify_image_seconds")
    if not isinstance(verify, int | float):
        raise DemoError(f"restore {tag} ({driver}): admit reported no verify_image_seconds")
    return {"seconds": answer.seconds, "steps": receipt.timings(), "verify_image": verify}


def _report(
    results: dict[str, Any], conditions: list[tuple[str, bool]], drivers: tuple[str, ...]
) -> None:
    print()
    print(
        f"{'':24}{'cold (s)':>10}{'restore (s)':>13}{'ratio':>8}   restore min-max (s)"
        f"{'verify image (s)':>19}{'of restore':>12}"
    )
    for condition, _ in conditions:
        rows = [r for r in results["rows"] if r["condition"] == condition]
        cold = statistics.median(r["cold"].seconds for r in rows)
        for label, driver in (("P1 n610", "n610"), ("P2 n580", "n580")):
            if driver not in drivers:
                continue
            times = [r[driver]["seconds"] for r in rows]
            median = statistics.median(times)
            verify = statistics.median(r[driver]["verify_image"] for r in rows)
            results[f"{label[:2]}_{condition}"] = {
                "cold_median": cold,
                "restore_median": median,
                "ratio": cold / median,
                "verify_image_median": verify,
                "verify_image_of_restore": verify / median,
            }
            print(
                f"{label} {condition + ' cache':16}{cold:10.2f}{median:13.2f}"
                f"{cold / median:7.1f}x   {min(times):.2f}-{max(times):.2f}"
                f"{verify:19.3f}{100 * verify / median:11.1f}%"
            )
    print()
    print("restore steps, median seconds (steps over 10 ms):")
    for condition, _ in conditions:
        for driver in drivers:
            steps: dict[str, list[float]] = {}
            for row in results["rows"]:
                if row["condition"] == condition:
                    for name, seconds in row[driver]["steps"].items():
                        steps.setdefault(name, []).append(seconds)
            medians = {n: statistics.median(v) for n, v in steps.items()}
            print(
                f"  {driver} {condition:7}: "
                + ", ".join(f"{n} {m:.2f}" for n, m in medians.items() if m > 0.01)
            )


def _revision() -> str:
    """The commit measured (and whether the tree had local changes): the code moves fast."""
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _plain(value: Any) -> Any:
    if hasattr(value, "seconds") and hasattr(value, "tokens"):
        return {"seconds": value.seconds, "tokens": list(value.tokens)}
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
