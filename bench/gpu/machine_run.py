"""n610 capture and restore of the GPU workload through `Machine` with coldsnap's real
components (the product path: N610Driver with CRIU and the CUDA checkpoint API, the HTTP engine
steps, the native provider, the content-addressed store), on the H200 or, with --dry, on CPU.

    python3 bench/gpu/machine_run.py --out OUT --preset 2g [--restores 2] [--dry]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from coldsnap import CaptureRequest, Machine, ModelRef, RestoreRequest  # noqa: E402
from coldsnap.backends import Criu  # noqa: E402
from coldsnap.capsules import StoreArtifacts  # noqa: E402
from coldsnap.drivers.n610 import N610Driver, default_cuda  # noqa: E402
from coldsnap.engines import EnginePolicy  # noqa: E402
from coldsnap.engines.sglang import (  # noqa: E402
    RUNTIME_ROOT,
    SGLangEngine,
    coldsnap_env,
    free_port,
)
from coldsnap.machine import REGISTRY, InstalledBuild, LaunchCommand  # noqa: E402
from coldsnap.providers._steps import NativeProvider  # noqa: E402

POLICY = EnginePolicy(name="workload")


class WorkloadLauncher:
    def __init__(self, preset: str, device: str, base_env: dict[str, str]) -> None:
        self.preset, self.device, self.base_env = preset, device, base_env

    def command(self, request: Any, workdir: Path, *, provider: str) -> LaunchCommand:
        runtime_dir = RUNTIME_ROOT / uuid.uuid4().hex
        runtime_dir.mkdir(parents=True, mode=0o700)
        port = free_port()
        argv = [
            sys.executable,
            str(HERE / "workload.py"),
            "--port",
            str(port),
            "--preset",
            self.preset,
            "--device",
            self.device,
        ]
        env = {**self.base_env, **coldsnap_env(request, provider, runtime_dir, None)}
        return LaunchCommand(argv=argv, env=env, url=f"http://127.0.0.1:{port}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--restores", type=int, default=2)
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    from qualify import Qualify  # the harness knows the workload's environment (TMS preload)

    q = Qualify.__new__(Qualify)
    q.args = argparse.Namespace(dry=args.dry)
    base_env = q._workload_env()
    root = Path("/var/tmp/coldsnap-machine-run")
    shutil.rmtree(root, ignore_errors=True)
    (root / "model").mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = None if args.dry else default_cuda()
    if not args.dry and cuda is None:
        raise SystemExit("no CUDA checkpoint API here")
    launcher = WorkloadLauncher(args.preset, "cpu" if args.dry else "cuda", base_env)
    source = (HERE / "workload.py").read_bytes()
    engine = SGLangEngine(
        launcher,
        policy=POLICY,
        # cuda=False: the stand-in workload writes no plugin measurement of its release, so the
        # engine does not check residency (the real SGLang harness, sglang_machine.py, does).
        name="workload",
        identity=lambda: InstalledBuild(
            engine="workload",
            version="1",
            contract="sha256:" + hashlib.sha256(source).hexdigest(),
            plugin_digest="sha256:" + hashlib.sha256(source).hexdigest(),
        ),
    )
    # Requests name registered engines only: register this one for the run.
    REGISTRY.register_engine("workload", build=lambda request: engine)
    driver = N610Driver(launcher=launcher, criu=Criu(os.environ.get("COLDSNAP_CRIU")), cuda=cuda)
    machine = Machine(
        driver=driver,
        provider=NativeProvider(),
        engine=engine,
        artifacts=StoreArtifacts(engine),
        subscribers=[_print],
    )
    model = ModelRef(id="workload", revision=args.preset, path=str(root / "model"))
    results: dict[str, Any] = {"preset": args.preset}
    t0 = time.perf_counter()
    capture = machine.capture(
        CaptureRequest(
            driver="n610",
            provider="native",
            engine="workload",
            model=model,
            workdir=str(root / "cap"),
            store=str(root / "store"),
            name="workload",
        )
    )
    results["capture"] = _summary(capture, time.perf_counter() - t0)
    print("capture", capture.outcome, capture.error, flush=True)
    for i in range(args.restores if capture.ok else 0):
        t0 = time.perf_counter()
        restored = machine.restore(
            RestoreRequest(
                driver="n610",
                provider="native",
                engine="workload",
                artifact="workload",
                model=model,
                workdir=str(root / f"res{i}"),
                store=str(root / "store"),
            )
        )
        results[f"restore{i}"] = _summary(restored, time.perf_counter() - t0)
        print(f"restore{i}", restored.outcome, restored.error, flush=True)
        if restored.ok:
            machine.stop(restored)
    (args.out / "machine_run.json").write_text(json.dumps(results, indent=1, default=str))
    ok = capture.ok and all(results[k]["outcome"] == "done" for k in results if k != "preset")
    raise SystemExit(0 if ok else 1)


def _print(event: Any) -> None:
    if event.phase in ("done", "skipped", "failed", "compensated", "compensation_failed"):
        print(
            f"  {event.spec:13} {event.step:18} {event.phase:10} {event.seconds:7.3f} s "
            f"{event.detail[:300]}",
            flush=True,
        )


def _summary(receipt: Any, wall: float) -> dict[str, Any]:
    keep = ("image_bytes", "capsule_bytes", "payload_bytes", "acceptance_tokens", "cuda_pids")
    return {
        "outcome": receipt.outcome,
        "error": receipt.error,
        "wall_s": round(wall, 3),
        "steps": receipt.timings(),
        "facts": {k: receipt.facts.get(k) for k in keep},
    }


if __name__ == "__main__":
    main()
