"""Serving after restore: SGLang's own `bench_serving` against a cold server and an n610-restored
one of the same model, in interleaved rounds, with the memory of each server's process tree.

    .venv/bin/python bench/bench_serving.py [--rounds 5] [--prompts 32] [--input-len 32]
                                            [--output-len 16] [--json OUT]

A tiny Llama is captured once (n610, native provider; untimed). Each round then starts a plain
`python -m sglang.launch_server` (cold) and restores the capsule (restored), in alternating
order (ABBA...) so drift and order effects hit both alike; each server answers one greedy
request (the restored one must equal the cold one token for token), then
`python -m sglang.benchmark.serving --backend sglang --dataset-name random-ids --flush-cache`
runs against it (random token ids: no dataset download), and the memory of its process tree
is read from /proc before and after (RSS summed, PSS summed, private bytes). The report gives
medians, min-max and the restored/cold ratio of each; the goals are throughput >= 0.95
and RSS <= 1.05 of the cold server's. Run it alone on the machine (flock the server lock).
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

from coldsnap.backends.procs import tree_pids
from coldsnap.cli._demo import (
    DemoError,
    capture,
    first_answer,
    plain_command,
    restore_to_first_answer,
    start_plain_server,
    wait_first_answer,
)
from coldsnap.machine import ModelRef, RestoreRequest

METRICS = (
    ("output_throughput", "output tok/s", True),
    ("request_throughput", "requests/s", True),
    ("median_ttft_ms", "median TTFT ms", False),
    ("median_tpot_ms", "median TPOT ms", False),
    ("median_itl_ms", "median ITL ms", False),
    ("median_e2e_latency_ms", "median e2e ms", False),
)
MEMORY = (("rss", "RSS summed"), ("pss", "PSS summed"), ("private", "private (USS)"))
KINDS = ("cold", "restored")


def tree_memory(pid: int) -> dict[str, int]:
    """RSS, PSS and private bytes summed over a process tree (smaps_rollup)."""
    total = {"rss": 0, "pss": 0, "private": 0, "processes": 0}
    for p in tree_pids(pid):
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        fields = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in text.splitlines()[1:]
            if line.endswith("kB")
        }
        total["rss"] += fields.get("Rss", 0)
        total["pss"] += fields.get("Pss", 0)
        total["private"] += fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
        total["processes"] += 1
    return total


def client_env(model: Path, root: Path) -> dict[str, str]:
    """The benchmark client's environment: the server's, plus a stand-in for Hugging Face
    `datasets`, which sglang.benchmark imports at load time (for MMMU) but never calls for
    random-ids; it is not installed here. The stand-in raises if it is ever called."""
    _, env, _ = plain_command(model)
    stub = root / "client-stubs"
    stub.mkdir(exist_ok=True)
    (stub / "datasets.py").write_text(
        "def load_dataset(*args, **kwargs):\n"
        "    raise RuntimeError('bench_serving stand-in: datasets is not installed')\n"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(stub), env.get("PYTHONPATH", "")])
    return env


def bench_serving(url: str, model: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of SGLang's bench_serving; its JSON result line."""
    env = client_env(model, out.parent)
    cmd = [
        sys.executable, "-m", "sglang.benchmark.serving",
        "--backend", "sglang", "--base-url", url, "--tokenizer", str(model),
        "--dataset-name", "random-ids", "--num-prompts", str(args.prompts),
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--seed", "1", "--flush-cache", "--disable-tqdm", "--output-file", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not out.exists():
        raise DemoError(f"bench_serving failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    if result.get("completed") != args.prompts:
        raise DemoError(f"bench_serving completed {result.get('completed')} of {args.prompts}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args()
    at_least_one(parser, "--rounds", args.rounds)
    if host_problem("bench_serving"):
        return 2
    rows: list[dict[str, Any]] = []
    with work_dir("bench_serving") as root:
        info, model = tiny_llama(root)
        receipt = capture(capture_request(root, model, "n610", "native", "n610"))
        print(f"captured n610: image {receipt.facts.get('image_bytes', 0) / 1e6:.1f} MB")
        expected: tuple[int, ...] | None = None
        for r in range(args.rounds):
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            for kind in order:
                row, tokens = _one(kind, r, root, info.path, model, expected, args)
                expected = expected or tokens
                rows.append(row)
                print(
                    f"  round {r} {kind:8}: {row['output_throughput']:7.1f} output tok/s, "
                    f"TTFT {row['median_ttft_ms']:7.1f} ms, RSS {row['rss_after'] / 1e6:6.0f} MB, "
                    f"PSS {row['pss_after'] / 1e6:6.0f} MB (load {row['load']})"
                )
        summary = _report(rows)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
        print(f"load average at end {load()}")
    return 0


def _one(
    kind: str,
    r: int,
    root: Path,
    path: Path,
    model: ModelRef,
    expected: tuple[int, ...] | None,
    args: argparse.Namespace,
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Starts one server of `kind`, benchmarks it, reads its memory, stops it."""
    row: dict[str, Any] = {"kind": kind, "round": r, "load": f"{os.getloadavg()[0]:.2f}"}
    if kind == "cold":
        server = start_plain_server(path, root / "logs" / f"cold-{r}.log")
        try:
            wait_first_answer(server)
            tokens = first_answer(server.url)
            if expected is not None and tokens != expected:
                raise DemoError(f"cold answers differ: {tokens} vs {expected}")
            row.update(_measure(server.url, server.launched.pid, path, root, kind, r, args))
        finally:
            server.stop()
        return row, tokens
    if expected is None:
        raise DemoError("the restored server needs the cold answer first")
    restore = RestoreRequest(
        driver="n610",
        provider="native",
        model=model,
        engine="sglang",
        artifact="n610",
        workdir=str(root / f"restore-{r}"),
        store=str(root / "store"),
    )
    _, receipt, machine = restore_to_first_answer(restore, expected)
    try:
        url, pid = receipt.facts["engine_url"], int(receipt.facts["engine_pid"])
        row.update(_measure(url, pid, path, root, kind, r, args))
    finally:
        machine.stop(receipt)
        shutil.rmtree(restore.workdir, ignore_errors=True)
    return row, expected


def _measure(
    url: str, pid: int, path: Path, root: Path, kind: str, r: int, args: argparse.Namespace
) -> dict[str, Any]:
    before = tree_memory(pid)
    result = bench_serving(url, path, root / f"serving-{kind}-{r}.jsonl", args)
    time.sleep(0.5)
    after = tree_memory(pid)
    out: dict[str, Any] = {name: float(result[name]) for name, _, _ in METRICS}
    for key in ("rss", "pss", "private", "processes"):
        out[f"{key}_before"] = before[key]
        out[f"{key}_after"] = after[key]
    return out


def _report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    print()
    head = f"{'':22}{'cold median':>13}{'restored median':>17}{'ratio':>8}"
    print(head + "   cold / restored min-max")
    lines = [(m, label) for m, label, _ in METRICS] + [
        (f"{key}_after", f"{label} (MB)") for key, label in MEMORY
    ]
    for metric, label in lines:
        values = {k: [row[metric] for row in rows if row["kind"] == k] for k in KINDS}
        scale = 1e6 if metric.endswith("_after") else 1.0
        cold, restored = (statistics.median(values[k]) / scale for k in KINDS)
        ratio = restored / cold if cold else float("nan")
        spread = " / ".join(
            f"{min(values[k]) / scale:.1f}-{max(values[k]) / scale:.1f}" for k in KINDS
        )
        summary[metric] = {"cold": cold, "restored": restored, "ratio": ratio}
        print(f"{label:22}{cold:13.1f}{restored:17.1f}{ratio:8.3f}   {spread}")
    return summary


if __name__ == "__main__":
    sys.exit(main())
