"""Root causes of the architecture failures on the H200 with real SGLang 0.5.17 (bench only).

    python3 -P bench/gpu/arch_probe.py --out OUT [--phases tied,serve,qwen2]
        [--serve-archs mistral,gemma2,phi3,qwen2moe] [--budget 540] [--root DIR] [--light]
        [--engine-args="--attention-backend triton ..."]

Needs the in-engine probe on every engine's path (bench/gpu/arch_probe_site first on PYTHONPATH,
ARCH_PROBE_DIR set: bench/gpu/arch-probe-device.sh does both). Phases:

tied   A random Llama with tied embeddings (coldsnap.tiny_models size small, tied=True) captured
       by n610 native through `Machine`, then restored twice. At capture, right after the
       acceptance tokens were recorded, and at each restore, right after the refill (the
       restored engine answers health, the acceptance step has not run yet), the probe hashes
       every parameter and buffer of the served model inside the scheduler, SGLang's own
       /weights_checker checksums are read, and the acceptance request is sent again in three
       prefix-cache states: as it is, after /flush_cache, and after /flush_cache plus SGLang's
       own server warmup request (the request a fresh server sends itself before the capture
       records its acceptance tokens). Restore 0 then leaves the cache flushed before the
       machine's acceptance step, restore 1 leaves SGLang's warmup request in it. With --light
       the in-engine hashing is left out (SGLang's checksums cover the parameters, not the
       rotary caches).
qwen2  A tiny Qwen2 (tied, attention biases, head size 16) captured by n610 native: the trace
       says when a rotary `cos_sin_cache` was replaced and by which call, relative to the
       plugin's registration; the receipt, its compensations and the engine log say what the
       failed release and its compensation did to the server.
serve  Per architecture (tiny random Mistral with a sliding window, Gemma 2, Phi-3, Qwen2-MoE):
       a cold start of the capture's launch command (coldsnap's plugin loaded, memory saver on)
       to one greedy answer, the probe's registry check and rotary trace, then one release of
       the KV cache and the weights and the plugin's status record: would a capture's release
       pass the registry check? The servers start side by side where the phase stands in
       --phases and are read after the phases that follow it (put it after tied: a CRIU restore
       needs its PIDs free).

OUT gets arch_probe.json (results, written after every phase), probes.json (the probe's
answers), traces.jsonl (the engines' rotary and registration traces) and engine-logs.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ENGINE_ARGS = (
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--grammar-backend",
    "none",
    "--cuda-graph-max-bs",
    "8",
    "--mem-fraction-static",
    "0.05",
)
NEW_TOKENS = 16
WARMUP_TEXT = "The capital city of France is"  # SGLang 0.5.17's own server warmup prompt
WARMUP_TOKENS = 8
SERVE_ARCHS = ("mistral", "gemma2", "phi3", "qwen2moe")
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
}


def _prompt(seed: int, n: int) -> list[int]:
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % 990)
    return out


PROMPTS = {f"P{i}": _prompt(1000 + 17 * i, 18 + 5 * i) for i in range(1, 4)}


# -- models ---------------------------------------------------------------------------------------


def _configs(bos: int, eos: int) -> dict[str, Any]:
    """Small random configurations; head sizes as the real models have them where it matters to
    SGLang's rotary kernels (its fused kernel takes 64, 128, 256 and 512)."""
    from transformers import (
        Gemma2Config,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen2MoeConfig,
    )

    common: dict[str, Any] = dict(
        vocab_size=1000,
        max_position_embeddings=4096,
        bos_token_id=bos,
        eos_token_id=eos,
        dtype="bfloat16",
        num_hidden_layers=2,
    )
    return {
        # Qwen2 always has q/k/v biases; hidden 64 over 4 heads: head size 16
        "qwen2": lambda: Qwen2Config(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            **common,
        ),
        "mistral": lambda: MistralConfig(
            hidden_size=512,
            intermediate_size=1024,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            sliding_window=32,
            rms_norm_eps=1e-6,
            **common,
        ),
        "gemma2": lambda: Gemma2Config(
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=32,
            **common,
        ),
        # Phi-3 mini's head size is 96 (3072 / 32)
        "phi3": lambda: Phi3Config(
            hidden_size=384,
            intermediate_size=768,
            num_attention_heads=4,
            num_key_value_heads=4,
            pad_token_id=2,
            original_max_position_embeddings=4096,
            **common,
        ),
        "qwen2moe": lambda: Qwen2MoeConfig(
            hidden_size=512,
            intermediate_size=1024,
            moe_intermediate_size=256,
            shared_expert_intermediate_size=512,
            num_experts=8,
            num_experts_per_tok=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            decoder_sparse_step=1,
            **common,
        ),
    }


def build_arch(dest: Path, arch: str, tokenizer_from: Path) -> dict[str, Any]:
    """A random checkpoint of `arch` (bf16 safetensors in the hub's tensor names) with the
    tokenizer of `tokenizer_from` (a coldsnap.tiny_models build, vocabulary 1000)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    if (dest / "config.json").exists():
        return json.loads((dest / "config.json").read_text())
    info = json.loads((tokenizer_from / "config.json").read_text())
    cfg = _configs(info["bos_token_id"], info["eos_token_id"])[arch]()
    cfg.architectures = [ARCHITECTURES[arch]]  # what SGLang's model registry looks up
    if arch == "gemma2":
        # Gemma 2 checkpoints on the hub name the activation twice; transformers 5 writes only
        # hidden_activation, and SGLang 0.5.17's Gemma 2 reads hidden_act
        cfg.hidden_act = "gelu_pytorch_tanh"
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    shapes = {n: tuple(t.shape) for n, t in skeleton.state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, Any] = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shapes[name], generator=gen)
        else:
            t = 0.02 * torch.randn(shapes[name], generator=gen)
        tensors.update(_hub_names(name, t))
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in tokenizer_from.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, tmp / f.name)
    cfg.save_pretrained(str(tmp))
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
        str(tmp / "model.safetensors"),
        metadata={"format": "pt"},
    )
    tmp.rename(dest)
    return json.loads((dest / "config.json").read_text())


def _hub_names(name: str, t: Any) -> dict[str, Any]:
    """transformers 5 fuses a MoE layer's experts into two 3-D tensors; checkpoints on the hub
    (and SGLang's loader) name each expert's projections apart."""
    base, _, leaf = name.rpartition(".")
    if base.endswith("experts") and t.dim() == 3 and leaf in ("gate_up_proj", "down_proj"):
        out = {}
        for e in range(t.shape[0]):
            if leaf == "gate_up_proj":
                gate, up = t[e].chunk(2, dim=0)
                out[f"{base}.{e}.gate_proj.weight"] = gate
                out[f"{base}.{e}.up_proj.weight"] = up
            else:
                out[f"{base}.{e}.down_proj.weight"] = t[e]
        return out
    return {name: t}


# -- the probe and the engine ---------------------------------------------------------------------


class Probe:
    """Asks the in-engine probe (arch_probe_site/sitecustomize.py) and keeps its answers."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.answers: dict[str, Any] = {}

    def ask(self, tag: str, runtime_dir: str, timeout: float = 120.0) -> dict[str, Any] | None:
        """Asks the engine whose COLDSNAP_RUNTIME_DIR is `runtime_dir` (one of several)."""
        (self.dir / f"req-{tag}").write_text(runtime_dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted(self.dir.glob(f"ans-{tag}-*.json"))
            if found:
                answer = json.loads(found[0].read_text())
                self.answers[tag] = answer
                return answer
            time.sleep(0.2)
        return None

    def traces(self) -> list[dict[str, Any]]:
        lines = []
        for f in sorted(self.dir.glob("trace-*.jsonl")):
            lines += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        return lines


def engine_url(model_path: str) -> tuple[str, str]:
    """The URL and runtime dir of the running engine serving `model_path` (from its command
    line and environment)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "sglang.launch_server" in args and model_path in args and "--port" in args:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            runtime = [
                e[len(b"COLDSNAP_RUNTIME_DIR=") :]
                for e in env
                if e.startswith(b"COLDSNAP_RUNTIME_DIR=")
            ]
            url = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
            return url, runtime[0].decode() if runtime else ""
    raise RuntimeError(f"no running engine serves {model_path}")


def client(url: str) -> Any:
    from coldsnap.engines._client import EngineClient
    from coldsnap.engines.sglang import SGLANG_POLICY

    return EngineClient(url, SGLANG_POLICY)


def generate(
    url: str, *, ids: list[int] | None = None, text: str | None = None, n: int = NEW_TOKENS
) -> list[int]:
    import httpx

    body: dict[str, Any] = {"sampling_params": {"max_new_tokens": n, "temperature": 0.0}}
    if ids is not None:
        body["input_ids"] = ids
    else:
        body["text"] = text
    r = httpx.post(f"{url}/generate", json=body, timeout=300.0)
    if r.status_code != 200:
        raise RuntimeError(f"/generate: HTTP {r.status_code}: {r.text[:300]}")
    return [int(t) for t in r.json()["output_ids"]]


def engine_checks(
    model_path: str, probe: Probe | None, tag: str, *, end_with_warmup: bool
) -> dict[str, Any]:
    """Probe (unless None), SGLang's checksums, and the acceptance request in three prefix-cache
    states. The client is closed before returning: a connection left open at capture would be
    a live TCP connection in the image."""
    url, runtime_dir = engine_url(model_path)
    rec: dict[str, Any] = {"url": url}
    if probe is not None:
        t = time.perf_counter()
        answer = probe.ask(tag, runtime_dir)
        rec["probe_s"] = round(time.perf_counter() - t, 2)
        rec["probe"] = None if answer is None else {
            role: m["check_live"] for role, m in answer["models"].items()
        }  # fmt: skip
    with client(url) as c:
        try:
            rec["sglang_checksums"] = c.weights_checksum()
        except Exception as exc:
            rec["sglang_checksums"] = {"error": f"{type(exc).__name__}: {exc}"}
        rec["acceptance_as_is"] = list(c.acceptance_tokens())
        c.flush_cache()
        rec["acceptance_flushed"] = list(c.acceptance_tokens())
        c.flush_cache()
        rec["warmup_answer"] = generate(url, text=WARMUP_TEXT, n=WARMUP_TOKENS)
        rec["acceptance_after_warmup"] = list(c.acceptance_tokens())
        rec["answers_flushed"] = {}
        for name, ids in PROMPTS.items():
            c.flush_cache()
            rec["answers_flushed"][name] = generate(url, ids=ids)
        c.flush_cache()
        if end_with_warmup:  # the prefix cache as a fresh server's own warmup leaves it
            generate(url, text=WARMUP_TEXT, n=WARMUP_TOKENS)
    rec["left_cache"] = "warmup request" if end_with_warmup else "flushed"
    return rec


def checksum_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> Any:
    """Names whose SGLang /weights_checker checksum differs between two engines."""
    try:
        ca = a["ranks"][0]["checksums"]  # type: ignore[index]
        cb = b["ranks"][0]["checksums"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return {"error": "a checksum answer is missing"}
    names = sorted(set(ca) | set(cb))
    return {"tensors": len(names), "differ": [n for n in names if ca.get(n) != cb.get(n)]}


def tensor_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any]:
    """Per role: names whose bytes differ between two probe answers, with both sides' stats."""
    if a is None or b is None:
        return {"error": "a probe answer is missing"}
    out: dict[str, Any] = {}
    for role, ma in a["models"].items():
        mb = b["models"].get(role)
        if mb is None:
            out[role] = "missing in the second answer"
            continue
        ta, tb = ma["tensors"], mb["tensors"]
        names = sorted(set(ta) | set(tb))
        differ = {}
        for n in names:
            x, y = ta.get(n), tb.get(n)
            if x is None or y is None or x["hash"] != y["hash"] or x["dtype"] != y["dtype"]:
                differ[n] = {"first": _brief(x), "second": _brief(y)}
        aliases_a = _aliases(ta)
        aliases_b = _aliases(tb)
        out[role] = {
            "tensors": len(names),
            "differ": differ,
            "equal": len(names) - len(differ),
            "aliases_first": aliases_a,
            "aliases_second": aliases_b,
        }
    return out


def _brief(x: dict[str, Any] | None) -> Any:
    if x is None:
        return None
    keys = ("kind", "dtype", "shape", "storage_ptr", "hash", "sum", "abs_sum", "zeros", "head")
    return {k: x.get(k) for k in keys}


def _aliases(table: dict[str, Any]) -> list[list[str]]:
    by_ptr: dict[int, list[str]] = {}
    for name, x in table.items():
        by_ptr.setdefault(x["data_ptr"], []).append(name)
    return sorted(sorted(v) for v in by_ptr.values() if len(v) > 1)


# -- the run --------------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.root = Path(args.root)
        self.models = self.root / "models"
        self.t0 = time.monotonic()
        self.probe = Probe(Path(os.environ["ARCH_PROBE_DIR"]))
        # --light: no in-engine hashing at capture and restore (about 36 s each for the small
        # model on the H200, its thread competing with the scheduler's for the GIL)
        self.deep_probe: Probe | None = None if args.light else self.probe
        global ENGINE_ARGS
        if args.engine_args is not None:
            ENGINE_ARGS = tuple(args.engine_args.split())
        self.results: dict[str, Any] = {"engine_args": list(ENGINE_ARGS), "log": []}
        self.logs: list[Path] = []

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def log(self, *parts: Any) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] " + " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.results["log"].append(line)

    def save(self) -> None:
        (self.out / "arch_probe.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "probes.json").write_text(json.dumps(self.probe.answers, default=str))
        traces = self.probe.traces()
        with open(self.out / "traces.jsonl", "w") as f:
            for t in traces:
                f.write(json.dumps(t, default=str) + "\n")
        with open(self.out / "engine-logs.txt", "w") as f:
            for log in self.logs:
                if log.exists():
                    data = log.read_bytes()[-400_000:].decode(errors="replace")
                    f.write(f"\n===== {log} (last {len(data)} chars)\n{data}")

    def event_logger(self, hooks: dict[tuple[str, str], Any]) -> Any:
        def on_event(event: Any) -> None:
            if event.phase in ("done", "failed", "compensated", "compensation_failed", "skipped"):
                self.log(
                    f"  {event.operation} {event.step}: {event.phase}", (event.detail or "")[:600]
                )
            hook = hooks.get((event.step, event.phase))
            if hook is not None:
                try:
                    hook()
                except Exception:
                    self.log("  hook failed", traceback.format_exc())

        return on_event

    def tokenizer_model(self) -> Path:
        from coldsnap.tiny_models import build_model

        return build_model(self.models / "llama-tiny", "llama", "tiny", 0).path

    # -- tied Llama ---------------------------------------------------------------------------
    def phase_tied(self) -> dict[str, Any]:
        from coldsnap import CaptureRequest, Machine, ModelRef, RestoreRequest
        from coldsnap.tiny_models import build_model

        rec: dict[str, Any] = {}
        info = build_model(self.models / "llama-small-tied", "llama", "small", 0, tied=True)
        ref = ModelRef(id="llama-small-tied", revision="seed0", path=str(info.path))
        store, base = str(self.root / "store"), self.root / "tied"
        base.mkdir(parents=True, exist_ok=True)
        request = CaptureRequest(
            driver="n610",
            provider="native",
            engine="sglang",
            model=ref,
            workdir=str(base / "capture"),
            store=store,
            name="tied",
            engine_args=ENGINE_ARGS,
        )
        self.logs.append(base / "capture" / "engine.log")

        def at_capture() -> None:
            rec["capture_checks"] = engine_checks(
                str(info.path), self.deep_probe, "tied-cap", end_with_warmup=False
            )

        machine = Machine.for_request(
            request, subscribers=[self.event_logger({("acceptance_record", "done"): at_capture})]
        )
        t = time.perf_counter()
        receipt = machine.capture(request)
        rec["capture"] = _receipt(receipt, time.perf_counter() - t)
        rec["recorded_acceptance"] = receipt.facts.get("acceptance_tokens")
        self.log("tied capture", receipt.outcome, receipt.error or "")
        self.save()
        if not receipt.ok:
            return rec
        rec["restores"] = []
        for i in range(2):
            if self.left() < 25:  # a light restore with its checks took under 5 s on the H200
                rec["restores"].append({"skipped": f"budget: {self.left():.0f} s left"})
                continue
            r: dict[str, Any] = {}
            rr = RestoreRequest(
                driver="n610",
                provider="native",
                engine="sglang",
                artifact="tied",
                model=ref,
                workdir=str(base / f"restore{i}"),
                store=store,
                engine_args=ENGINE_ARGS,
            )
            self.logs.append(base / f"restore{i}" / "engine.log")

            def at_restore(i: int = i, r: dict[str, Any] = r) -> None:
                r["checks"] = engine_checks(
                    str(info.path), self.deep_probe, f"tied-rest{i}", end_with_warmup=(i == 1)
                )

            machine = Machine.for_request(
                rr, subscribers=[self.event_logger({("wait_healthy", "done"): at_restore})]
            )
            t = time.perf_counter()
            receipt = machine.restore(rr)
            r["receipt"] = _receipt(receipt, time.perf_counter() - t)
            r["tensor_diff_vs_capture"] = tensor_diff(
                self.probe.answers.get("tied-cap"), self.probe.answers.get(f"tied-rest{i}")
            )
            r["sglang_checksum_diff_vs_capture"] = checksum_diff(
                (rec.get("capture_checks") or {}).get("sglang_checksums"),
                (r.get("checks") or {}).get("sglang_checksums"),
            )
            self.log(f"tied restore{i}", receipt.outcome, receipt.error or "")
            if receipt.ok:
                machine.stop(receipt)
            rec["restores"].append(r)
            self.save()
        return rec

    # -- Qwen2 --------------------------------------------------------------------------------
    def phase_qwen2(self) -> dict[str, Any]:
        from coldsnap import CaptureRequest, Machine, ModelRef

        rec: dict[str, Any] = {}
        path = self.models / "qwen2-tiny-tied"
        rec["config"] = build_arch(path, "qwen2", self.tokenizer_model())
        ref = ModelRef(id="qwen2-tiny-tied", revision="seed0", path=str(path))
        base = self.root / "qwen2"
        base.mkdir(parents=True, exist_ok=True)
        request = CaptureRequest(
            driver="n610",
            provider="native",
            engine="sglang",
            model=ref,
            workdir=str(base / "capture"),
            store=str(self.root / "store"),
            name="qwen2",
            engine_args=ENGINE_ARGS,
        )
        log = base / "capture" / "engine.log"
        self.logs.append(log)

        def probe(tag: str) -> Any:
            def ask() -> None:
                answer = self.probe.ask(tag, engine_url(str(path))[1])
                rec[tag] = (
                    None
                    if answer is None
                    else {role: m["check_live"] for role, m in answer["models"].items()}
                )

            return ask

        hooks = {
            ("wait_healthy", "done"): probe("qwen2-healthy"),
            ("acceptance_record", "done"): probe("qwen2-accepted"),
        }
        machine = Machine.for_request(request, subscribers=[self.event_logger(hooks)])
        t = time.perf_counter()
        receipt = machine.capture(request)
        rec["capture"] = _receipt(receipt, time.perf_counter() - t)
        pid = receipt.facts.get("engine_pid")
        rec["engine_pid"] = pid
        rec["engine_alive_after"] = bool(pid) and Path(f"/proc/{pid}").exists()
        rec["engine_log_lines"] = _grep(
            log, r"Scheduler hit an exception|Error|error|Traceback|coldsnap|KeyError|SIGQUIT"
        )
        self.log("qwen2 capture", receipt.outcome, receipt.error or "")
        return rec

    # -- serve architectures, side by side -------------------------------------------------
    def start_serve(self, arch: str) -> dict[str, Any]:
        """Builds the model and launches the capture's command line for it (not waited for)."""
        from coldsnap import CaptureRequest, ModelRef
        from coldsnap.backends import launch
        from coldsnap.engines.sglang import build
        from coldsnap.machine import WeightSource

        rec: dict[str, Any] = {}
        path = self.models / arch
        t = time.perf_counter()
        rec["config"] = build_arch(path, arch, self.tokenizer_model())
        rec["build_s"] = round(time.perf_counter() - t, 1)
        ref = ModelRef(id=f"{arch}-random", revision="seed0", path=str(path))
        work = self.root / "serve" / arch
        work.mkdir(parents=True, exist_ok=True)
        request = CaptureRequest(
            driver="n610", provider="native", engine="sglang", model=ref,
            workdir=str(work), store=str(self.root / "store"), name=arch, engine_args=ENGINE_ARGS,
        )  # fmt: skip
        weights = WeightSource(source="payload")  # the capture exports on release
        command = build(request).launcher.command(request, work, weights=weights)
        rec["argv"] = command.argv
        log = work / "engine.log"
        self.logs.append(log)
        launched = launch(
            command.argv, log_path=log, env={**os.environ, **command.env}, cwd=str(work)
        )
        return {"rec": rec, "command": command, "launched": launched, "log": log,
                "t0": time.perf_counter()}  # fmt: skip

    def finish_serve(self, arch: str, h: dict[str, Any]) -> dict[str, Any]:
        """Waits for the first greedy answer, probes, releases once, stops the server."""
        import httpx

        from coldsnap.backends.procs import kill_tree

        rec, command, launched = h["rec"], h["command"], h["launched"]
        runtime_dir = command.env["COLDSNAP_RUNTIME_DIR"]
        try:
            answer = None
            while answer is None:
                if launched.poll() is not None:
                    rec["error"] = "the server ended before answering"
                    break
                if self.left() < 15:
                    rec["error"] = f"no answer within {time.perf_counter() - h['t0']:.0f} s"
                    break
                try:
                    answer = generate(command.url, ids=PROMPTS["P1"])
                except Exception:
                    time.sleep(0.5)
            if answer is not None:
                rec["first_answer_s"] = round(time.perf_counter() - h["t0"], 1)
                rec["answer"] = answer
                client(command.url).flush_cache()
                rec["answer_flushed"] = generate(command.url, ids=PROMPTS["P1"])
                probe = self.probe.ask(f"serve-{arch}", runtime_dir)
                rec["check_live"] = None if probe is None else {
                    role: m["check_live"] for role, m in probe["models"].items()
                }  # fmt: skip
                r = httpx.post(
                    f"{command.url}/release_memory_occupation",
                    json={"tags": ["kv_cache", "weights"]},
                    timeout=120.0,
                )
                rec["release_http"] = [r.status_code, r.text[:300]]
                rec["status_records"] = _status_records(Path(runtime_dir))
        finally:
            kill_tree(launched.pid)
        rec["engine_log_lines"] = _grep(
            h["log"], r"Scheduler hit an exception|Error|Traceback|not supported|Unsupported"
        )[-60:]
        return rec

    def main(self) -> int:
        phases = self.args.phases
        self.results["device"] = _device()
        serving: dict[str, Any] = {}
        for phase in phases:
            if phase == "serve":
                # the other architectures start side by side now; they are read after the
                # phases that follow (no CRIU restore runs while they start: its PIDs must be free)
                for arch in self.args.serve_archs:
                    try:
                        serving[arch] = self.start_serve(arch)
                    except Exception:
                        self.results.setdefault("serve", {})[arch] = {
                            "error": traceback.format_exc()
                        }
                continue
            if self.left() < 150:
                self.results[phase] = {"skipped": f"budget: {self.left():.0f} s left"}
                continue
            try:
                self.results[phase] = getattr(self, f"phase_{phase}")()
            except Exception:
                self.results[phase] = {"error": traceback.format_exc()}
                self.log(phase, "failed", traceback.format_exc())
            self.save()
        serve = self.results.setdefault("serve", {})
        for arch, handle in serving.items():
            try:
                serve[arch] = self.finish_serve(arch, handle)
            except Exception:
                serve[arch] = {"error": traceback.format_exc()}
            self.log(
                "serve",
                arch,
                serve[arch].get("first_answer_s"),
                serve[arch].get("check_live"),
                serve[arch].get("error") or "",
            )
            self.save()
        self.save()
        return 0


def _receipt(receipt: Any, seconds: float) -> dict[str, Any]:
    return {
        "outcome": receipt.outcome,
        "error": receipt.error,
        "wall_s": round(seconds, 2),
        "steps": [[s.name, s.status, round(s.seconds, 2), s.detail[:400]] for s in receipt.steps],
        "compensations": [
            [s.name, s.status, round(s.seconds, 2), s.detail[:1500]] for s in receipt.compensations
        ],
    }


def _grep(path: Path, pattern: str) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return [f"unreadable: {exc}"]
    rx = re.compile(pattern)
    return [line[:400] for line in lines if rx.search(line)][-150:]


def _status_records(runtime_dir: Path) -> dict[str, Any]:
    out = {}
    for f in sorted(runtime_dir.glob("**/*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            out[f.name] = f"unreadable: {exc}"
            continue
        if isinstance(data, dict):
            keep = ("event", "outcome", "error", "released_tags", "freed_by", "operation")
            out[f.name] = {k: data.get(k) for k in keep if k in data}
    return out


def _device() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("/var/tmp/arch-probe"))
    split = lambda s: tuple(x for x in s.split(",") if x)  # noqa: E731
    p.add_argument("--phases", type=split, default=("tied", "serve", "qwen2"))
    p.add_argument("--serve-archs", type=split, default=SERVE_ARCHS)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    p.add_argument("--light", action="store_true", help="tied: no in-engine hashing")
    p.add_argument(
        "--engine-args", help="the engines' flags, one string (default: " + " ".join(ENGINE_ARGS)
    )
    args = p.parse_args(argv)
    bad = [x for x in args.phases if x not in ("tied", "qwen2", "serve")]
    bad += [x for x in args.serve_archs if x not in SERVE_ARCHS]
    if bad:
        p.error(f"unknown: {', '.join(bad)}")
    if not os.environ.get("ARCH_PROBE_DIR"):
        p.error("ARCH_PROBE_DIR is not set (bench/gpu/arch-probe-device.sh sets it)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from coldsnap.backends import become_subreaper

    become_subreaper()
    shutil.rmtree(args.root / "store", ignore_errors=True)
    args.root.mkdir(parents=True, exist_ok=True)
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
