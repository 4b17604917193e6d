"""A small real engine for driver and machine tests on CPU, where SGLang's 12 s start is too slow.

It is a real process (an HTTP server with torch weights and a greedy decoder), snapshotted and
restored for real, speaking the subset of SGLang's endpoints and coldsnap plugin files that the
machines use: `/health`, `/generate`, `/release_memory_occupation`,
`/resume_memory_occupation`, `/update_weights_from_disk`, the COLDSNAP_* start-up variables and
the resume plan in COLDSNAP_RUNTIME_DIR. Released weights give their pages back to the kernel at
the same addresses (as the plugin's CPU backend does), so a dump leaves them out and hydration
refills them in place.

    python -m coldsnap.testing.toy_engine --model-path DIR --port N [--load-format dummy]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from coldsnap import _wire as wire
from coldsnap.plugin._memory import discard_pages
from coldsnap.providers import PackDirectory, export_pack, hydrate_pack

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PAYLOAD_ROLE = "tp0/target"


def build_toy_model(
    dest: Path, *, vocab: int = 256, hidden: int = 512, layers: int = 4, seed: int = 0
) -> Path:
    """Writes a toy checkpoint: embeddings and `layers` square projections, float32."""
    dest.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {"embed": torch.randn(vocab, hidden, generator=gen)}
    for i in range(layers):
        tensors[f"proj.{i}"] = torch.randn(hidden, hidden, generator=gen) / hidden**0.5
    save_file(tensors, str(dest / WEIGHTS))
    (dest / CONFIG).write_text(json.dumps({"vocab": vocab, "hidden": hidden, "layers": layers}))
    return dest


def _page_aligned(shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over its own anonymous mapping, so its pages can be dropped and refilled."""
    numel = 1
    for size in shape:
        numel *= size
    # Private: MADV_DONTNEED frees private anonymous pages, but only unmaps shared ones (their
    # contents stay in the shared-memory object, and in a dump).
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    region = mmap.mmap(-1, max(numel * 4, mmap.PAGESIZE), flags=flags)
    return torch.frombuffer(region, dtype=torch.float32, count=numel).view(*shape)


class ToyEngine:
    def __init__(self, model_path: Path, *, dummy: bool) -> None:
        config = json.loads((model_path / CONFIG).read_text())
        self.model_path = model_path
        self.vocab = config["vocab"]
        self.tensors: dict[str, torch.Tensor] = {
            "embed": _page_aligned((config["vocab"], config["hidden"]))
        }
        for i in range(config["layers"]):
            self.tensors[f"proj.{i}"] = _page_aligned((config["hidden"], config["hidden"]))
        self.released: set[str] = set()
        self.lock = threading.Lock()
        self.runtime_dir = _env_path("COLDSNAP_RUNTIME_DIR")
        self.artifact_dir = _env_path("COLDSNAP_ARTIFACT_DIR")
        self.export = os.environ.get("COLDSNAP_EXPORT_MODEL_PAYLOAD", "0") in ("1", "true")
        startup = os.environ.get("COLDSNAP_SGLANG_STARTUP_SOURCE", "checkpoint")
        if startup == wire.PAYLOAD_SOURCE:
            assert self.artifact_dir is not None, "COLDSNAP_ARTIFACT_DIR is required"
            hydrate_pack(self.tensors, PackDirectory(self.artifact_dir / PAYLOAD_ROLE))
        elif not dummy:
            self.load(model_path)

    def load(self, path: Path) -> None:
        for name, value in load_file(str(path / WEIGHTS)).items():
            self.tensors[name].copy_(value)

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            embed = self.tensors["embed"]
            out: list[int] = []
            last = ids[-1] if ids else 0
            for _ in range(max_new_tokens):
                h = embed[last]
                for name in sorted(k for k in self.tensors if k.startswith("proj.")):
                    h = torch.tanh(h @ self.tensors[name])
                last = int(torch.argmax(embed @ h))
                out.append(last)
            return out

    def release(self, tags: list[str]) -> None:
        if wire.WEIGHTS in tags and wire.WEIGHTS not in self.released:
            if self.export and self.artifact_dir is not None:
                target = self.artifact_dir / PAYLOAD_ROLE
                if not (target / "index.json").exists():
                    export_pack(self.tensors, target)
            for tensor in self.tensors.values():
                discard_pages(tensor.data_ptr(), tensor.numel() * tensor.element_size())
        self.released |= set(tags)

    def resume(self, tags: list[str]) -> None:
        planned = self.runtime_dir is not None and (self.runtime_dir / wire.PLAN_FILE).exists()
        if wire.WEIGHTS in tags and wire.WEIGHTS in self.released and planned:
            plan = wire.read_plan(self.runtime_dir)  # type: ignore[arg-type]
            if plan.source == wire.PAYLOAD_SOURCE:
                hydrate_pack(self.tensors, PackDirectory(Path(plan.payload_dir) / PAYLOAD_ROLE))
            else:
                self.load(Path(plan.checkpoint))
        self.released -= set(tags)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _handler(engine: ToyEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/health", "/ready"):
                healthy = wire.WEIGHTS not in engine.released
                self._reply(200 if healthy else 503, {"healthy": healthy})
            else:
                self._reply(404, {"error": self.path})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            tags = body.get("tags") or list(wire.MEMORY_TAGS)
            with engine.lock:
                if self.path == "/generate":
                    ids = body.get("input_ids") or list(body.get("text", "").encode())
                    n = body.get("sampling_params", {}).get("max_new_tokens", 8)
                    self._reply(200, {"output_ids": engine.generate(ids, n), "meta_info": {}})
                elif self.path == "/release_memory_occupation":
                    engine.release(tags)
                    self._reply(200, {})
                elif self.path == "/resume_memory_occupation":
                    engine.resume(tags)
                    self._reply(200, {})
                elif self.path == "/update_weights_from_disk":
                    engine.load(Path(body["model_path"]))
                    self._reply(200, {"success": True, "message": "loaded"})
                elif self.path in ("/pause_generation", "/continue_generation", "/flush_cache"):
                    self._reply(200, {})
                else:
                    self._reply(404, {"error": self.path})

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toy-engine")
    parser.add_argument("--model-path", required=True, type=Path)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--load-format", default="auto")
    args = parser.parse_args(argv)
    engine = ToyEngine(args.model_path, dummy=args.load_format == "dummy")
    server = ThreadingHTTPServer((args.host, args.port), _handler(engine))
    server.serve_forever()


if __name__ == "__main__":
    main()
