"""`coldsnap-engine-rank`: what an orchestrator runs in each rank's pod to restore that rank's
capsule from a read-only, content-addressed runtime directory (a coldsnap store's directory,
mounted read-only: objects named by their digest).

A thin wrapper over Machine: it checks what only it can (the capsule is this rank's, and nothing
would be written into the runtime directory), builds a restore request for the driver named by
`--driver` (by default the one the capsule was captured with) and runs it. Admission
verifies every member against its digest before anything runs (a damaged object
is refused, naming the member). The workdir (journal, receipt, the laid-out capsule, logs) must
lie outside the runtime directory, which this process never creates, chmods or writes: a
runtime directory that lacks part of the store layout, or whose modes the store would narrow,
is refused before the Machine opens it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import attrs
import click

from coldsnap.artifacts import Store
from coldsnap.machine import Machine, RequestError, RestoreRequest

from ._errors import finish, reported
from ._events import print_json_event
from ._operations import request_json
from ._progress import LiveSteps
from ._signals import interrupts

LAYOUT = ("objects", "objects/sha256", "capsules", "tags", "tmp", "locks")
"""The store's directories (coldsnap.artifacts.Store makes any that are missing: here, refused)."""
_DIR_MODE = 0o700


def _debug() -> bool:
    return bool(os.environ.get("COLDSNAP_DEBUG"))


def check_runtime_dir(runtime: Path, workdir: Path) -> tuple[Path, Path]:
    """`runtime` and `workdir` as the paths they reach (`..` and symlinks resolved,
    os.path.realpath: a workdir spelled through either is still inside), once `runtime` is a
    whole store that opening would not change and `workdir` lies outside it (else
    RequestError). The run then uses these, not the spellings that were checked."""
    runtime, workdir = Path(os.path.realpath(runtime)), Path(os.path.realpath(workdir))
    if not runtime.is_dir():
        raise RequestError([("--runtime-dir", f"{runtime} is not a directory")])
    if workdir == runtime or workdir.is_relative_to(runtime):
        raise RequestError(
            [
                (
                    "--workdir",
                    f"{workdir} lies in the read-only runtime dir {runtime}: put it outside",
                )
            ]
        )
    problems: list[tuple[str, str]] = []
    for part in ("", *LAYOUT):
        path = runtime / part
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            problems.append(("--runtime-dir", f"{path} is missing (it is not created here)"))
            continue
        if not stat.S_ISDIR(st.st_mode):
            problems.append(("--runtime-dir", f"{path} is not a directory"))
        elif stat.S_IMODE(st.st_mode) != _DIR_MODE:
            problems.append(
                (
                    "--runtime-dir",
                    f"{path} has mode {stat.S_IMODE(st.st_mode):o}, not 700: the store would "
                    "change it, and the runtime dir is not written",
                )
            )
    if problems:
        raise RequestError(problems)
    return runtime, workdir


def _check_rank(runtime: Path, capsule: str, rank: int) -> str:
    """The capsule's digest, once its identity says it is `rank`'s part."""
    store = Store.open(runtime)  # read as it is: nothing is created or narrowed
    digest = store.resolve(capsule)
    identity = store.capsule(digest).identity
    if identity is None:
        raise RequestError([("--capsule", f"{capsule} carries no identity, so no rank to check")])
    topology = identity.topology
    if topology.rank != rank:
        raise RequestError(
            [
                (
                    "--rank",
                    f"capsule {capsule} is rank {topology.rank} of {topology.world_size}, "
                    f"not rank {rank}",
                )
            ]
        )
    return digest


@click.command(
    name="coldsnap-engine-rank",
    help="Restore this rank's capsule from a read-only runtime dir (a coldsnap store) and leave "
    "the engine serving; print its URL and PID. docs/cli.md, \"Rank entry points\".",
)
@click.option(
    "--runtime-dir", required=True, type=click.Path(path_type=Path),
    help="The read-only content-addressed runtime directory (a store).",
)  # fmt: skip
@click.option("--capsule", required=True, help="This rank's capsule: a tag or sha256: digest.")
@click.option(
    "--rank", required=True, type=click.IntRange(0), envvar=["COLDSNAP_RANK", "RANK"],
    help="This rank [env COLDSNAP_RANK, RANK].",
)  # fmt: skip
@click.option(
    "--workdir", required=True, type=click.Path(path_type=Path),
    help="This restore's directory, outside the runtime dir.",
)  # fmt: skip
@click.option(
    "--driver", envvar="COLDSNAP_DRIVER",
    help="The snapshot driver [env COLDSNAP_DRIVER; default: the capsule's].",
)  # fmt: skip
@click.option("--provider", help="The weight provider [default: the capsule's, else native].")
@click.option("--port", type=click.IntRange(1, 65535), help="Serve on PORT.")
@click.option("--host", help="Listen on this IPv4 address.")
@click.option(
    "--model-path", type=click.Path(path_type=Path),
    help="The checkpoint (for components that reload it).",
)  # fmt: skip
@click.option("--print-request", is_flag=True, help="Print the request JSON and exit.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
def rank(
    runtime_dir: Path,
    capsule: str,
    rank: int,
    workdir: Path,
    print_request: bool,
    as_json: bool,
    **options: Any,
) -> None:
    with reported(_debug):
        runtime_dir, workdir = check_runtime_dir(runtime_dir, workdir)
        digest = _check_rank(runtime_dir, capsule, rank)
        request = _request(runtime_dir, digest, workdir, **options)
        if print_request:
            click.echo(request_json(request))
            return
        with interrupts(request.workdir, events=as_json) as cancel:  # SIGTERM: roll back
            if as_json:
                machine = Machine.for_request(request, subscribers=[print_json_event])
                receipt = machine.restore(request, cancel=cancel)
            else:
                with LiveSteps() as live:
                    machine = Machine.for_request(request, subscribers=[live])
                    receipt = machine.restore(request, cancel=cancel)
    facts = receipt.facts
    extra = {"rank": rank, "url": facts.get("engine_url"), "pid": facts.get("engine_pid"),
             "capsule_digest": facts.get("capsule_digest")}  # fmt: skip
    finish(receipt, extra if receipt.ok else None, events=as_json)


def _request(
    runtime_dir: Path,
    digest: str,
    workdir: Path,
    *,
    driver: str | None,
    provider: str | None,
    port: int | None,
    host: str | None,
    model_path: Path | None,
) -> RestoreRequest:
    from coldsnap.machine import ModelRef

    from ._store_cmds import capture_record

    record = capture_record(Store.open(runtime_dir), digest)
    driver = driver or (record.driver if record is not None else None)
    if not driver:
        raise RequestError([("--driver", f"capsule {digest} has no capture record to name one")])
    provider = provider or (record.provider if record is not None else "native")
    request = RestoreRequest(
        driver=driver, provider=provider, artifact=digest, workdir=str(workdir),
        store=str(runtime_dir), port=port, host=host,
    )  # fmt: skip
    if record is not None:
        request = attrs.evolve(request, engine=record.engine, engine_args=record.engine_args)
        if model_path is not None:
            model = ModelRef(id=record.model_id, revision=record.revision,
                             path=str(model_path.absolute()))  # fmt: skip
            request = attrs.evolve(request, model=model)
    elif model_path is not None:
        raise RequestError([("--model-path", f"capsule {digest} has no capture record to pin it")])
    return request


__all__ = ["LAYOUT", "check_runtime_dir", "rank"]
