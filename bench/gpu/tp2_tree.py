"""The process tree that bench/gpu/tp2.py snapshots: one launcher and one process per rank.

    launcher (tree root, hosts the TCPStore server; no CUDA)
      +- rank 0 (GPU 0)   \\  an NCCL process group between them (gloo on CPU),
      +- rank 1 (GPU 1)   /   an HTTP control port each

One tree, so one CRIU dump holds every rank and both ends of every TCPStore connection
(dumped with --tcp-established). Each rank builds the same random Llama (same seed) with its
weights in torch_memory_saver's `weights` region and a static KV cache in `kv_cache`; the LM
head is vocab-parallel: rank r keeps rows [r*V/2, (r+1)*V/2) and every decode step gathers the
logits of all ranks over the process group, so the greedy tokens depend on the communicator.
A CUDA graph of the local decode step (no collective in it) is captured before the group
exists.

The ranks pass coldsnap.distributed barriers over the launcher's store:
  cold/ready          every rank built and joined the group;
  capture/dumped      every rank is dumpable: pack exported, weights/KV/graph released,
                      process group destroyed; the controller checkpoints and dumps after it;
  restore-N/restored  every rank runs again after the CRIU restore and the CUDA restore;
  restore-N/resumed   every rank re-created the group (store prefix pg-N) and hydrated;
  restore-N/ready     every rank's all-reduce gave the exact sum.
Each has a timeout; the error names the ranks that did not arrive.

    python bench/gpu/tp2_tree.py launcher --store-port P --port-base B --payload-dir D ...
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

# Never NVLink multicast on the lent multi-GPU machines (KINDS.md): set in every process.
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(NO_MULTICAST)

TAGS = ("kv_cache", "weights", "cuda_graph")


def log(*parts: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {os.getpid()}", *parts, flush=True)


# -- launcher -----------------------------------------------------------------------------


def launcher_main(args: argparse.Namespace, rank_argv: list[str]) -> int:
    """Starts the ranks first (their imports take longer than ours), then serves the store,
    then waits: a rank that ends takes the others down with it."""
    env = dict(os.environ)
    for item in args.rank_env:
        key, _, value = item.partition("=")
        env[key] = value
    env.update(NO_MULTICAST)
    children: list[subprocess.Popen[bytes]] = []
    for rank in range(args.world):
        argv = [sys.executable, str(Path(__file__).resolve()), "rank", "--rank", str(rank)]
        children.append(
            subprocess.Popen([*argv, *rank_argv], stdin=subprocess.DEVNULL, env=env, close_fds=True)
        )

    def stop(signum: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", args.store_port, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=args.store_timeout),
    )  # fmt: skip
    log(f"launcher: store on 127.0.0.1:{store.port}, ranks {[c.pid for c in children]}")
    pids = {c.pid: r for r, c in enumerate(children)}
    while True:
        pid, status = os.wait()
        if pid in pids:
            code = os.waitstatus_to_exitcode(status)
            log(f"launcher: rank {pids[pid]} (pid {pid}) ended with {code}; stopping the rest")
            stop(signal.SIGTERM, None)


# -- rank ---------------------------------------------------------------------------------


class Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist
        from workload import PRESETS, NullSaver, memory_saver

        from coldsnap.distributed import RankBarriers

        self.torch, self.dist, self.args = torch, dist, args
        self.rank, self.world = args.rank, args.world
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", self.rank) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.backend = "nccl" if self.cuda else "gloo"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.saver = memory_saver(args.device)
        self.frees = not isinstance(self.saver, NullSaver)  # torch_memory_saver in use
        self.timings: dict[str, float] = {}
        self.released: set[str] = set()
        self.exported: dict[str, Any] | None = None
        self.buffer_stash: dict[str, Any] = {}
        self.group: str | None = None
        self.nvml_shutdowns = 0
        t = time.perf_counter()
        self.store = dist.TCPStore(
            "127.0.0.1", args.store_port, is_master=False,
            timeout=datetime.timedelta(seconds=args.store_timeout),
        )  # fmt: skip
        self.timings["store_connect_s"] = time.perf_counter() - t
        self.RankBarriers = RankBarriers
        self._build(PRESETS[args.preset])
        t = time.perf_counter()
        self.init_group("cold")
        self.timings["group_init_s"] = time.perf_counter() - t
        self.barriers("cold").sync("ready", note=str(os.getpid()))

    def barriers(self, generation: str, timeout_s: float | None = None) -> Any:
        return self.RankBarriers(
            self.store, self.rank, self.world, timeout_s or self.args.barrier_timeout,
            generation=generation,
        )  # fmt: skip

    # -- model ---------------------------------------------------------------------------

    def _build(self, shape: dict[str, int]) -> None:
        torch = self.torch
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

        if shape["vocab"] % self.world:
            raise ValueError(f"vocab {shape['vocab']} is not divisible by {self.world} ranks")
        self.config = LlamaConfig(
            vocab_size=shape["vocab"], hidden_size=shape["hidden"],
            intermediate_size=shape["inter"], num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
            max_position_embeddings=4096, tie_word_embeddings=False,
            initializer_range=0.1,  # at 0.02 a random model repeats one token; 0.1 varies
        )  # fmt: skip
        self.config._attn_implementation = "sdpa"
        t = time.perf_counter()
        torch.manual_seed(self.args.seed)  # the same weights on every rank
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        per = shape["vocab"] // self.world
        try:
            with torch.device(self.device), self.saver.region(tag="weights"):
                model = LlamaForCausalLM(self.config)
                full = model.lm_head.weight
                head = torch.nn.Linear(shape["hidden"], per, bias=False)
                with torch.no_grad():
                    head.weight.copy_(full[self.rank * per : (self.rank + 1) * per])
                model.lm_head = head
                del full
                if self.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()  # the full head's segment, inside the region
        finally:
            torch.set_default_dtype(default)
        self.model = model.eval().requires_grad_(False)
        self.timings["build_model_s"] = time.perf_counter() - t

        self.max_len = self.args.max_cache_len
        head_dim = shape["hidden"] // shape["heads"]
        with torch.device(self.device), self.saver.region(tag="kv_cache"):
            self.cache = StaticCache(config=self.config, max_cache_len=self.max_len)
            if hasattr(self.cache, "early_initialization"):
                self.cache.early_initialization(
                    batch_size=1, num_heads=shape["kv_heads"], head_dim=head_dim,
                    dtype=self.dtype, device=self.device,
                )  # fmt: skip
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.mask = torch.zeros((1, 1, 1, self.max_len), dtype=torch.bool, device=self.device)
        self.graph: Any = None
        self.graph_logits: Any = None
        self.graph_error: str | None = None
        if self.cuda and not self.args.no_graph:
            t = time.perf_counter()
            try:
                self._capture()
            except Exception as exc:  # serve eagerly, and say why
                self.graph, self.graph_error = None, f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            self.timings["graph_capture_s"] = time.perf_counter() - t
        if self.cuda:
            torch.cuda.empty_cache()

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _local(self, ids: Any, start: int, mask: Any = None) -> Any:
        """Local logits (this rank's vocab slice) of the last position of `ids`."""
        torch = self.torch
        positions = torch.arange(start, start + ids.shape[1], device=self.device)
        if mask is None:
            cols = torch.arange(self.max_len, device=self.device)
            mask = (cols[None, :] <= positions[:, None])[None, None]
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions[None],
            cache_position=positions, past_key_values=self.cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return out.logits[:, -1, :]

    def _step(self) -> Any:
        out = self.model(
            input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos[None],
            cache_position=self.pos, past_key_values=self.cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return out.logits[:, -1, :]

    def _capture(self) -> None:
        torch = self.torch
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

    def _decode_local(self, token: Any, position: int, use_graph: bool) -> Any:
        self.mask[..., position] = True
        if use_graph and self.graph is not None:
            self.ids.copy_(token.view(1, 1))
            self.pos.fill_(position)
            self.graph.replay()
            return self.graph_logits
        return self._local(token.view(1, 1), position, self.mask)

    def _gather(self, local: Any) -> Any:
        """The full vocabulary's logits: every rank's slice, over the process group."""
        parts = [self.torch.empty_like(local) for _ in range(self.world)]
        self.dist.all_gather(parts, local.contiguous())
        return self.torch.cat(parts, dim=-1)

    def generate(self, prompt: list[int], new_tokens: int, use_graph: bool) -> list[int]:
        torch = self.torch
        if self.released or self.group is None:
            raise RuntimeError(f"released {sorted(self.released)}, group {self.group}")
        n = len(prompt)
        if not prompt or n + new_tokens > self.max_len:
            raise ValueError(f"prompt of {n} + {new_tokens} tokens must fit {self.max_len}")
        with torch.inference_mode():
            self.cache.reset()
            self.mask.zero_()
            self.mask[..., :n] = True
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            token = self._gather(self._local(ids, 0)).argmax(-1)
            out = [token]
            for i in range(new_tokens - 1):
                token = self._gather(self._decode_local(token, n + i, use_graph)).argmax(-1)
                out.append(token)
        return [int(t) for t in torch.cat(out).tolist()]

    def local_check(self) -> dict[str, Any]:
        """sha256 of this rank's local logits for one decode step after a fixed prefill, by
        graph replay and eagerly (no collective): bit-identical before and after restore."""
        torch = self.torch
        out: dict[str, Any] = {}
        with torch.inference_mode():
            for mode in ("graph", "eager"):
                if mode == "graph" and self.graph is None:
                    continue
                self.cache.reset()
                self.mask.zero_()
                self.mask[..., :4] = True
                self._local(torch.tensor([[1, 2, 3, 4]], device=self.device), 0)
                token = torch.tensor([5], device=self.device)
                logits = self._decode_local(token, 4, mode == "graph").float().cpu()
                out[f"{mode}_sha256"] = hashlib.sha256(logits.numpy().tobytes()).hexdigest()
        return out

    def allreduce(self) -> dict[str, Any]:
        """An all-reduce (sum) of rank-dependent values, compared exactly with the sum."""
        torch = self.torch
        n = 1 << 20
        base = torch.arange(n, dtype=torch.float32)
        x = (base * (self.rank + 1)).to(self.device)
        t = time.perf_counter()
        self.dist.all_reduce(x)
        self._sync()
        seconds = time.perf_counter() - t
        expected = base * sum(r + 1 for r in range(self.world))
        return {"ok": bool(torch.equal(x.cpu(), expected)), "elements": n, "seconds": seconds}

    # -- group ---------------------------------------------------------------------------

    def init_group(self, prefix: str) -> None:
        """The process group over the launcher's store, under a prefix of its own."""
        kwargs: dict[str, Any] = {
            "backend": self.backend,
            "store": self.dist.PrefixStore(f"tp2/pg/{prefix}", self.store),
            "rank": self.rank,
            "world_size": self.world,
            "timeout": datetime.timedelta(seconds=self.args.group_timeout),
        }
        if self.cuda:
            kwargs["device_id"] = self.device  # create the communicator now, not lazily
        self.dist.init_process_group(**kwargs)
        self.group = prefix

    def destroy_group(self) -> None:
        self.dist.destroy_process_group()
        self.group = None

    # -- capture and restore -------------------------------------------------------------

    def tensors(self) -> dict[str, Any]:
        from coldsnap.providers import final_tensors

        return final_tensors(self.model)

    def release(self) -> dict[str, Any]:
        from coldsnap.plugin._payload import pack_dir
        from coldsnap.providers import export_pack

        info: dict[str, Any] = {}
        t0 = time.perf_counter()
        self._sync()
        if self.exported is None:
            dest = pack_dir(self.args.payload_dir, self.rank, "target")
            result = export_pack(self.tensors(), dest)
            self.exported = {"path": str(dest), "nbytes": result.nbytes, "seconds": result.seconds}
        info["export"] = self.exported
        self.buffer_stash = {
            n: b.detach().to("cpu", copy=True) for n, b in self.model.named_buffers()
        }
        if not self.frees:  # CPU: nothing is freed, so wipe what a release would lose
            with self.torch.no_grad():
                for t in [*self.tensors().values(), *dict(self.model.named_buffers()).values()]:
                    t.zero_()
        for tag in TAGS:
            if tag not in self.released:
                self.saver.pause(tag)
                self.released.add(tag)
        t = time.perf_counter()
        self.destroy_group()
        info["group_destroy_s"] = time.perf_counter() - t
        if self.args.nvml_shutdown:  # NCCL's NVML handles hold /dev/nvidia* files open
            nvml = _nvml()
            while nvml is not None and self.nvml_shutdowns < 16 and nvml.nvmlShutdown() == 0:
                self.nvml_shutdowns += 1
            info["nvml_shutdowns"] = self.nvml_shutdowns if nvml is not None else "no NVML"
        if self.cuda:
            torch = self.torch
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            with contextlib.suppress(Exception):
                torch._C._host_emptyCache()
            free, total = torch.cuda.mem_get_info()
            info["gpu_used_bytes_after"] = total - free
        info["release_s"] = time.perf_counter() - t0
        info["dumped_wait_s"] = self.barriers("capture").sync("dumped", note=str(os.getpid()))
        return info

    def resume(
        self, nonce: str, preverified: bool, barrier_timeout: float | None = None
    ) -> dict[str, Any]:
        from coldsnap.plugin._payload import pack_dir
        from coldsnap.providers import PackDirectory, hydrate_pack

        barriers = self.barriers(f"restore-{nonce}", barrier_timeout)
        info: dict[str, Any] = {"restored_wait_s": barriers.sync("restored")}
        for _ in range(self.nvml_shutdowns):
            info["nvml_init"] = _nvml().nvmlInit_v2()  # as many as were shut down
        self.nvml_shutdowns = 0
        t = time.perf_counter()
        self.init_group(f"pg-{nonce}")
        info["group_init_s"] = time.perf_counter() - t
        t = time.perf_counter()
        self.saver.resume("weights")
        self.released.discard("weights")
        with self.torch.no_grad():
            for name, buf in self.model.named_buffers():
                if name in self.buffer_stash:
                    buf.copy_(self.buffer_stash[name])
        source = PackDirectory(pack_dir(self.args.payload_dir, self.rank, "target"))
        report = hydrate_pack(self.tensors(), source, verify=not preverified)
        info["hydrate"] = {
            "nbytes": report.nbytes, "seconds": report.seconds,
            "gib_per_s": report.gib_per_s, "verify": not preverified,
        }  # fmt: skip
        for tag in ("kv_cache", "cuda_graph"):
            self.saver.resume(tag)
            self.released.discard(tag)
        self._sync()
        info["resume_weights_s"] = time.perf_counter() - t
        info["resumed_wait_s"] = barriers.sync("resumed")
        info["allreduce"] = self.allreduce()
        if not info["allreduce"]["ok"]:
            raise RuntimeError(f"all-reduce after restore gave a wrong sum: {info['allreduce']}")
        info["ready_wait_s"] = barriers.sync("ready")
        return info

    def probe(self) -> dict[str, Any]:
        tensors = self.tensors()
        out: dict[str, Any] = {
            "pid": os.getpid(),
            "rank": self.rank,
            "group": self.group,
            "released": sorted(self.released),
            "weights_bytes": sum(t.untyped_storage().nbytes() for t in tensors.values()),
            "weight_ptrs": {n: t.data_ptr() for n, t in tensors.items()},
            "buffer_ptrs": {n: b.data_ptr() for n, b in self.model.named_buffers()},
            "graph_ptr": self.graph_logits.data_ptr() if self.graph_logits is not None else None,
            "graph_captured": self.graph is not None,
            "graph_error": self.graph_error,
            "timings": self.timings,
        }
        if self.cuda:
            free, total = self.torch.cuda.mem_get_info()
            out["gpu_used_bytes"] = total - free
        if not self.released:
            out["local_check"] = self.local_check()
        return out


def _nvml() -> Any:
    """NVML's library (the instance NCCL loaded, if it did), or None where there is none."""
    import ctypes

    try:
        return ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None


def serve(rank: Rank, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # each connection closed after its answer (CRIU)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, data: Any) -> None:
            payload = json.dumps(data, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _guard(self, fn: Any) -> None:
            try:
                result = fn()
            except Exception as exc:
                traceback.print_exc()
                self._answer(500, {"message": f"{type(exc).__name__}: {exc}"})
                return
            self._answer(200, result)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, {"rank": rank.rank, "released": sorted(rank.released)})
            elif self.path == "/probe":
                self._guard(rank.probe)
            else:
                self._answer(404, {"message": f"no GET {self.path}"})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}") if n else {}
            routes = {
                "/generate": lambda: {
                    "output_ids": rank.generate(
                        [int(t) for t in body["input_ids"]],
                        int(body.get("max_new_tokens", 16)),
                        use_graph=not body.get("eager", False),
                    )
                },
                "/allreduce": rank.allreduce,
                "/release": rank.release,
                "/resume": lambda: rank.resume(
                    str(body["nonce"]), bool(body.get("preverified")), body.get("barrier_timeout")
                ),
            }
            if self.path in routes:
                self._guard(routes[self.path])
            else:
                self._answer(404, {"message": f"no POST {self.path}"})

    server = HTTPServer(("127.0.0.1", port), Handler)
    log(f"rank {rank.rank}: serving on 127.0.0.1:{port} {json.dumps(rank.timings)}")
    server.serve_forever()


def rank_main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    rank = Rank(args)
    rank.timings["startup_s"] = time.perf_counter() - start
    serve(rank, args.port_base + args.rank)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("role", choices=("launcher", "rank"))
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--store-port", type=int, required=True)
    p.add_argument("--port-base", type=int, required=True)
    p.add_argument("--payload-dir", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--preset", default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-cache-len", type=int, default=256)
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--store-timeout", type=float, default=120.0)
    p.add_argument("--group-timeout", type=float, default=120.0)
    p.add_argument("--barrier-timeout", type=float, default=60.0)
    p.add_argument("--nvml-shutdown", action="store_true", help="shut NVML down for the dump")
    p.add_argument("--rank-env", action="append", default=[], help="KEY=VALUE for the ranks")
    args = p.parse_args(argv)
    if args.role == "launcher":
        # the ranks get the same options, less the launcher's own
        rank_argv: list[str] = []
        skip = False
        for i, a in enumerate(argv):
            if skip:
                skip = False
            elif a == "launcher" and i == 0:
                continue
            elif a == "--rank-env":
                skip = True
            elif not a.startswith("--rank-env="):
                rank_argv.append(a)
        return launcher_main(args, rank_argv)
    if not 0 <= args.rank < args.world:
        p.error(f"--rank {args.rank} is not in 0..{args.world - 1}")
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
