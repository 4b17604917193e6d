from __future__ import annotations

from pathlib import Path

from coldsnap.machine import CaptureRequest, ModelRef, RestoreRequest


def capture_request(tmp: Path, driver: str = "n610", provider: str = "native", *,
                    workdir: str = "cap", name: str = "tiny") -> CaptureRequest:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    return CaptureRequest(
        driver=driver, provider=provider, workdir=str(tmp / workdir), store=str(tmp / "store"),
        model=ModelRef(id="tiny", revision="r1", path=str(model)), name=name,
    )


def restore_request(tmp: Path, driver: str = "n610", provider: str = "native", *,
                    workdir: str = "res", artifact: str = "tiny") -> RestoreRequest:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    return RestoreRequest(
        driver=driver, provider=provider, workdir=str(tmp / workdir), store=str(tmp / "store"),
        artifact=artifact, model=ModelRef(id="tiny", revision="r1", path=str(model)),
    )


