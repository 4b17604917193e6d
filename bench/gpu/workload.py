"""A GPU torch workload that behaves like an SGLang server toward coldsnap, for qualifying n610.

SGLang itself cannot travel to the H200 machine (gpu-facts.md), so this is a small stand-in
that uses the same mechanisms SGLang uses there:
- a transformers causal LM (random weights, built at start from a config) whose weights are
  allocated inside torch_memory_saver's `weights` region, a static KV cache inside `kv_cache`,
  and one decode step captured as a CUDA graph inside `cuda_graph` (TMS preload mode: the
  process is started with LD_PRELOAD of the TMS hook library);
- SGLang's endpoints as coldsnap's engine client calls them: GET /health, POST /generate
  ({input_ids or text, sampling_params: {max_new_tokens, temperature: 0}} -> {output_ids}),
  POST /release_memory_occupation {tags} and POST /resume_memory_occupation {tags};
- the plugin's contract: on release of `weights` with COLDSNAP_EXPORT_MODEL_PAYLOAD=1 it writes
  the native pack under COLDSNAP_ARTIFACT_DIR/tp0/target first; on resume of `weights` it reads
  the resume plan in COLDSNAP_RUNTIME_DIR (coldsnap.plugin's record) and hydrates the same
  storages in place (registered mapping, pinned ring as fallback).
Plus GET /coldsnap/probe: data_ptrs, GPU memory and a graph replay check, for the harness.

CRIU-friendly: one thread serves HTTP (HTTP/1.0, each connection closed after its answer), no
io_uring (started through coldsnap.backends.launch, which blocks it), stdin /dev/null.

    python bench/gpu/workload.py --port 30000 --preset 8g
    python bench/gpu/workload.py --port 30000 --preset tiny --device cpu   # dry run on CPU
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 1 << 30
TAGS = ("weights", "kv_cache", "cuda_graph")
PRESETS: dict[str, dict[str, int]] = {
    # hidden, intermediate, layers, heads, kv heads, vocab
    "tiny": dict(hidden=256, inter=688, layers=2, heads=4, kv_heads=2, vocab=1000),
    "small": dict(hidden=1024, inter=2816, layers=4, heads=16, kv_heads=4, vocab=32000),
    # Llama-3-8B-like layer shape (GQA 32/8, MLP 14336), depth chosen for the weight size
    "2g": dict(hidden=4096, inter=14336, layers=4, heads=32, kv_heads=8, vocab=32000),
    "4g": dict(hidden=4096, inter=14336, layers=9, heads=32, kv_heads=8, vocab=32000),
    "8g": dict(hidden=4096, inter=14336, layers=18, heads=32, kv_heads=8, vocab=32000),
}


class NullSaver:
    """Stands in for torch_memory_saver where it cannot run (CPU dry runs): nothing is freed."""

    enabled = False

    def region(self, tag: str, **_: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def cuda_graph(self, cuda_graph: Any, tag: str, **_: Any) -> Any:
        return torch.cuda.graph(cuda_graph)

    def pause(self, tag: str) -> None:
        pass

    def resume(self, tag: str) -> None:
        pass


def memory_saver(device: str) -> Any:
    if device != "cuda" or "torch_memory_saver" not in os.environ.get("LD_PRELOAD", ""):
        return NullSaver()
    from torch_memory_saver import torch_memory_saver

    return torch_memory_saver


class Workload:
    def __init__(self, args: argparse.Namespace) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

        self.args = args
        self.device = torch.device(args.device)
        self.saver = memory_saver(args.device)
        shape = dict(PRESETS[args.preset])
        if args.layers:
            shape["layers"] = args.layers
        self.config = LlamaConfig(
            vocab_size=shape["vocab"],
            hidden_size=shape["hidden"],
            intermediate_size=shape["inter"],
            num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"],
            max_position_embeddings=max(4096, args.max_cache_len),
            tie_word_embeddings=False,
        )
        self.config._attn_implementation = "sdpa"
        self.dtype = torch.bfloat16
        self.timings: dict[str, float] = {}
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device), self.saver.region(tag="weights"):
                self.model = LlamaForCausalLM(self.config)
        finally:
            torch.set_default_dtype(default)
        self.model.eval().requires_grad_(False)
        self._sync()
        self.timings["build_model_s"] = time.perf_counter() - start

        start = time.perf_counter()
        self.max_len = args.max_cache_len
        head_dim = shape["hidden"] // shape["heads"]
        with torch.device(self.device), self.saver.region(tag="kv_cache"):
            self.cache = StaticCache(config=self.config, max_cache_len=self.max_len)
            if hasattr(self.cache, "early_initialization"):
                self.cache.early_initialization(
                    batch_size=1, num_heads=shape["kv_heads"], head_dim=head_dim,
                    dtype=self.dtype, device=self.device,
                )  # fmt: skip
            else:  # older transformers: the first update allocates
                self._forward(torch.zeros((1, 1), dtype=torch.long, device=self.device), 0)
        self._sync()
        self.timings["kv_cache_s"] = time.perf_counter() - start

        self.ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.mask = torch.zeros((1, 1, 1, self.max_len), dtype=torch.bool, device=self.device)
        self.graph: Any = None
        self.graph_logits: torch.Tensor | None = None
        self.graph_error: str | None = None
        if self.device.type == "cuda" and not args.no_graph:
            start = time.perf_counter()
            try:
                self._capture()
            except Exception as exc:  # keep serving eagerly, and say why
                self.graph, self.graph_error = None, f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            self.timings["graph_capture_s"] = time.perf_counter() - start
        self.released: set[str] = set()
        self.buffer_stash: dict[str, torch.Tensor] = {}
        self.exported: dict[str, Any] | None = None
        self.background: threading.Thread | None = None
        self.last_hydrate: dict[str, Any] | None = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- model ---------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _forward(self, ids: torch.Tensor, start: int, mask: torch.Tensor | None = None):
        """One forward over `ids` at positions start.. (cache filled before them)."""
        n = ids.shape[1]
        positions = torch.arange(start, start + n, device=self.device)
        if mask is None:
            cols = torch.arange(self.max_len, device=self.device)
            mask = (cols[None, :] <= positions[:, None])[None, None]
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions[None],
            cache_position=positions, past_key_values=self.cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return out.logits[:, -1, :]

    def _step(self) -> torch.Tensor:
        """The decode step the graph holds: static ids, position and mask."""
        out = self.model(
            input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos[None],
            cache_position=self.pos, past_key_values=self.cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return out.logits[:, -1, :]

    def _capture(self) -> None:
        self.cache.reset()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with self.saver.cuda_graph(cuda_graph=graph, tag="cuda_graph"):
            logits = self._step()
        torch.cuda.synchronize()
        self.graph, self.graph_logits = graph, logits
        self.cache.reset()

    def _decode(self, token: torch.Tensor, position: int, use_graph: bool) -> torch.Tensor:
        self.mask[..., position] = True
        if use_graph and self.graph is not None:
            self.ids.copy_(token.view(1, 1))
            self.pos.fill_(position)
            self.graph.replay()
            assert self.graph_logits is not None
            return self.graph_logits
        return self._forward(token.view(1, 1), position, self.mask)

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, use_graph: bool = True):
        if self.released & {"weights", "kv_cache"}:
            raise RuntimeError(f"memory released ({sorted(self.released)}): resume first")
        n = len(prompt)
        if not prompt or n + max_new_tokens > self.max_len:
            raise ValueError(f"prompt of {n} + {max_new_tokens} new tokens must fit {self.max_len}")
        self.cache.reset()
        self.mask.zero_()
        self.mask[..., :n] = True
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        token = self._forward(ids, 0).argmax(-1)
        out = [token]
        for i in range(max_new_tokens - 1):
            token = self._decode(token, n + i, use_graph).argmax(-1)
            out.append(token)
        return [int(t) for t in torch.cat(out).tolist()]

    @torch.inference_mode()
    def graph_check(self) -> dict[str, Any]:
        """Replays the graph for one decode step after a fixed prefill, and runs the same step
        eagerly: the graph's logits (sha256) must equal the eager ones and those at capture."""
        prompt = [1, 2, 3, 4]
        results = {}
        for mode in ("graph", "eager"):
            if mode == "graph" and self.graph is None:
                continue
            self.cache.reset()
            self.mask.zero_()
            self.mask[..., : len(prompt)] = True
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            self._forward(ids, 0)
            token = torch.tensor([5], device=self.device)
            logits = self._decode(token, len(prompt), mode == "graph").float().clone()
            results[mode] = logits
        eager = results["eager"]
        out: dict[str, Any] = {
            "eager_sha256": _sha(eager),
            "eager_argmax": int(eager.argmax()),
        }
        if "graph" in results:
            graph = results["graph"]
            out.update(
                graph_sha256=_sha(graph),
                graph_argmax=int(graph.argmax()),
                graph_max_abs_diff_vs_eager=float((graph - eager).abs().max()),
            )
        return out

    # -- probe ---------------------------------------------------------------------------

    def tensors(self) -> dict[str, torch.Tensor]:
        from coldsnap.providers import final_tensors

        return final_tensors(self.model)

    def kv_tensors(self) -> list[torch.Tensor]:
        if hasattr(self.cache, "layers"):
            return [t for layer in self.cache.layers for t in (layer.keys, layer.values)]
        return [*self.cache.key_cache, *self.cache.value_cache]

    def probe(self, graph: bool) -> dict[str, Any]:
        weights = {n: t.data_ptr() for n, t in self.tensors().items()}
        buffers = {n: b.data_ptr() for n, b in self.model.named_buffers()}
        kv = [t.data_ptr() for t in self.kv_tensors()]
        out: dict[str, Any] = {
            "pid": os.getpid(),
            "released": sorted(self.released),
            "weights_bytes": sum(t.untyped_storage().nbytes() for t in self.tensors().values()),
            "kv_bytes": sum(t.untyped_storage().nbytes() for t in self.kv_tensors()),
            "weight_ptrs": weights,
            "buffer_ptrs": buffers,
            "kv_ptrs": kv,
            "graph_ptrs": [self.graph_logits.data_ptr()] if self.graph_logits is not None else [],
            "ptrs_sha256": hashlib.sha256(
                json.dumps([weights, buffers, kv], sort_keys=True).encode()
            ).hexdigest(),
            "graph_captured": self.graph is not None,
            "graph_error": self.graph_error,
            "timings": self.timings,
            "last_hydrate": self.last_hydrate,
            "exported": self.exported,
        }
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info()
            out["gpu_used_bytes"] = total - free
            out["torch_reserved_bytes"] = torch.cuda.memory_reserved()
        if graph and not self.released & {"weights", "kv_cache", "cuda_graph"}:
            out["graph_check"] = self.graph_check()
        return out

    # -- memory --------------------------------------------------------------------------

    def _join_background(self) -> None:
        if self.background is not None:
            self.background.join()
            self.background = None

    def release(self, tags: list[str]) -> dict[str, Any]:
        self._join_background()
        start = time.perf_counter()
        info: dict[str, Any] = {}
        self._sync()
        if "weights" in tags and "weights" not in self.released:
            if os.environ.get("COLDSNAP_EXPORT_MODEL_PAYLOAD") == "1" and self.exported is None:
                info["export"] = self.export()
            self.buffer_stash = {
                n: b.detach().to("cpu", copy=True) for n, b in self.model.named_buffers()
            }
        for tag in ("kv_cache", "weights", "cuda_graph"):
            if tag in tags and tag not in self.released:
                self.saver.pause(tag)
                self.released.add(tag)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            with contextlib.suppress(Exception):
                torch._C._host_emptyCache()  # cached pinned blocks (export's staging buffer)
            free, total = torch.cuda.mem_get_info()
            info["gpu_used_bytes_after"] = total - free
        info["seconds"] = time.perf_counter() - start
        return info

    def export(self) -> dict[str, Any]:
        from coldsnap.plugin._payload import pack_dir
        from coldsnap.providers import export_pack

        root = os.environ.get("COLDSNAP_ARTIFACT_DIR")
        if not root:
            raise RuntimeError("COLDSNAP_EXPORT_MODEL_PAYLOAD=1 needs COLDSNAP_ARTIFACT_DIR")
        dest = pack_dir(root, 0, "target")
        result = export_pack(self.tensors(), dest)
        self.exported = {"path": str(dest), "nbytes": result.nbytes, "seconds": result.seconds}
        return self.exported

    def resume(self, tags: list[str]) -> dict[str, Any]:
        start = time.perf_counter()
        info: dict[str, Any] = {}
        if "weights" in tags and "weights" in self.released:
            self.saver.resume("weights")
            self.released.discard("weights")
            with torch.no_grad():
                for name, buf in self.model.named_buffers():
                    if name in self.buffer_stash:
                        buf.copy_(self.buffer_stash[name])
            info["hydrate"] = self.hydrate()
        for tag in ("kv_cache", "cuda_graph"):
            if tag in tags and tag in self.released:
                self.saver.resume(tag)
                self.released.discard(tag)
        self._sync()
        info["seconds"] = time.perf_counter() - start
        return info

    def hydrate(self) -> dict[str, Any] | None:
        """Fills the weights from the plan's native pack; None when no plan is there (like
        SGLang without coldsnap: the weights are garbage after a resume)."""
        from coldsnap._wire import PlanError, read_plan
        from coldsnap.plugin._payload import pack_dir
        from coldsnap.providers import PackDirectory

        runtime = os.environ.get("COLDSNAP_RUNTIME_DIR")
        if not runtime:
            return None
        try:
            plan = read_plan(Path(runtime))
        except PlanError as exc:
            return {"skipped": str(exc)}
        if plan.source != "payload" or not plan.payload_dir:
            return {"skipped": f"source {plan.source}"}
        source = PackDirectory(pack_dir(plan.payload_dir, 0, "target"))
        verify = not plan.preverified
        method = self.args.hydrate if self.device.type == "cuda" else "ring"
        start = time.perf_counter()
        report: dict[str, Any] = {"verify": verify}
        if method in ("auto", "registered"):
            import fastpath

            try:
                packs = fastpath.RegisteredPacks(
                    source,
                    register_threads=self.args.register_threads,
                    verify_threads=self.args.verify_threads,
                )
                try:
                    r = packs.copy(self.tensors(), verify=verify, unregister=False)
                except BaseException:
                    packs.close()
                    raise
                # Unregistering and unmapping stay off the restore's path.
                self.background = threading.Thread(target=packs.close, daemon=True)
                self.background.start()
                report.update(
                    method="registered", nbytes=r.nbytes, seconds=r.seconds,
                    register_seconds=r.register_seconds, copy_wait_seconds=r.copy_wait_seconds,
                    verify_seconds=r.verify_seconds, gib_per_s=r.gib_per_s,
                )  # fmt: skip
            except fastpath.RegistrationRefused as exc:
                if method == "registered":
                    raise
                report["fallback_reason"] = str(exc)
                method = "ring"
        if method == "ring":
            from coldsnap.providers import hydrate_pack

            r = hydrate_pack(self.tensors(), source, verify=verify)
            report.update(
                method="ring", nbytes=r.nbytes, seconds=r.seconds,
                verify_seconds=r.verify_seconds, copy_seconds=r.copy_seconds,
                gib_per_s=r.gib_per_s,
            )  # fmt: skip
        report["wall_seconds"] = time.perf_counter() - start
        self.last_hydrate = report
        return report


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().numpy().tobytes()).hexdigest()


def _prompt_ids(body: dict[str, Any], vocab: int) -> list[int]:
    if body.get("input_ids") is not None:
        return [int(t) for t in body["input_ids"]]
    text = body.get("text")
    if not isinstance(text, str) or not text:
        raise ValueError("generate needs 'input_ids' or 'text'")
    return [(b % (vocab - 1)) + 1 for b in text.encode()]


def serve(work: Workload, port: int) -> None:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, data: Any) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, {"released": sorted(work.released)})
            elif self.path.startswith("/coldsnap/probe"):
                with lock:
                    self._guard(lambda: work.probe(graph="graph=0" not in self.path))
            else:
                self._answer(404, {"message": f"no GET {self.path}"})

        def do_POST(self) -> None:
            try:
                body = self._body()
            except ValueError as exc:
                self._answer(400, {"message": f"bad JSON: {exc}"})
                return
            tags = list(body.get("tags") or TAGS)
            bad = [t for t in tags if t not in TAGS]
            with lock:
                if self.path in ("/release_memory_occupation", "/resume_memory_occupation") and bad:
                    self._answer(400, {"message": f"unknown tags {bad}"})
                elif self.path == "/generate":
                    self._guard(lambda: self._generate(body))
                elif self.path == "/release_memory_occupation":
                    self._guard(lambda: work.release(tags))
                elif self.path == "/resume_memory_occupation":
                    self._guard(lambda: work.resume(tags))
                elif self.path == "/flush_cache":
                    self._answer(200, {})  # one request at a time: nothing to drain
                else:
                    self._answer(404, {"message": f"no POST {self.path}"})

        def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
            params = body.get("sampling_params") or {}
            if float(params.get("temperature", 0.0)) != 0.0:
                raise ValueError("this workload decodes greedily only (temperature 0)")
            start = time.perf_counter()
            ids = work.generate(
                _prompt_ids(body, work.config.vocab_size),
                int(params.get("max_new_tokens", 16)),
                use_graph=not body.get("eager", False),
            )
            return {
                "output_ids": ids,
                "text": "",
                "meta_info": {
                    "decode": "graph" if work.graph is not None else "eager",
                    "seconds": time.perf_counter() - start,
                },
            }

        def _guard(self, fn: Any) -> None:
            try:
                result = fn()
            except (ValueError, RuntimeError) as exc:
                traceback.print_exc()
                self._answer(400, {"message": f"{type(exc).__name__}: {exc}"})
                return
            except Exception as exc:
                traceback.print_exc()
                self._answer(500, {"message": f"{type(exc).__name__}: {exc}"})
                return
            self._answer(200, result)

    server = HTTPServer(("127.0.0.1", port), Handler)
    print(f"workload: serving on 127.0.0.1:{port} pid {os.getpid()}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--layers", type=int, default=0, help="override the preset's depth")
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-cache-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--hydrate", choices=("auto", "registered", "ring"), default="auto")
    p.add_argument("--register-threads", type=int, default=4)
    p.add_argument("--verify-threads", type=int, default=8)
    args = p.parse_args(argv)
    start = time.perf_counter()
    work = Workload(args)
    work.timings["startup_s"] = time.perf_counter() - start
    print(f"workload: ready {json.dumps(work.timings)}", flush=True)
    serve(work, args.port)


if __name__ == "__main__":
    main()
