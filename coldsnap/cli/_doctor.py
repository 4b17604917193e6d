"""`coldsnap doctor`: what this host must offer for a capture or a restore, one check per
requirement. The checks are data (name, function, fix); each function looks at the host through
a probe (coldsnap.backends._probe, the Criu and CudaCheckpoint backends, the plugin's contracts)
and answers a Finding. Status `ok`, `missing` (the fix says what to do) or `n/a` (the requirement
does not apply on this host); the exit status is 5 when anything is missing, else 0.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs
import click
from attrs import define, frozen

from coldsnap._errors import ColdsnapError
from coldsnap.backends import Criu, CudaCheckpoint, _probe

from ._errors import ENVIRONMENT_MISSING, OK

T = TypeVar("T")

STATUS_OK, MISSING, NOT_APPLICABLE = "ok", "missing", "n/a"
MIN_DRIVER = 580


@frozen
class Finding:
    """What a check found; `fix`, where given, replaces the check's own fix (a check that could
    not run is fixed by what stopped it, not by what it checks)."""

    status: str
    detail: str
    fix: str | None = None


@define
class Host:
    """What the checks share: the --store to check, whether to check SGLang's contracts (which
    imports SGLang), and one CRIU found once (None: unusable)."""

    store: Path | None = None
    contracts: bool = False
    _criu: Criu | None = None
    _criu_problem: str | None = None
    _found: bool = False

    def criu(self) -> tuple[Criu | None, str | None]:
        """The CRIU to use ($COLDSNAP_CRIU, else the installed one) when its version is good,
        else None and why."""
        if not self._found:
            self._found = True
            criu = Criu()
            try:
                criu.require_version()
            except (ColdsnapError, OSError, subprocess.SubprocessError) as exc:
                self._criu_problem = str(exc)
            else:
                self._criu = criu
        return self._criu, self._criu_problem


@frozen
class Check:
    name: str
    run: Callable[[Host], Finding]
    fix: str


def _ok(detail: str) -> Finding:
    return Finding(STATUS_OK, detail)


def _missing(detail: str) -> Finding:
    return Finding(MISSING, detail)


_AS_ROOT = "run `coldsnap doctor` as root to check this"
_SEE_CRIU = "fix the criu line first"


def _root() -> Finding | None:
    uid = os.geteuid()
    if uid == 0:
        return None
    return Finding(MISSING, f"not checked: needs root (running as uid {uid})", _AS_ROOT)


def check_root(host: Host) -> Finding:
    uid = os.geteuid()
    return _ok("running as root") if uid == 0 else _missing(f"running as uid {uid}, not root")


def check_criu(host: Host) -> Finding:
    criu, problem = host.criu()
    if criu is None:
        return _missing(problem or "no usable CRIU")
    return _ok(f"CRIU {criu.version()} at {criu.binary}")


def _with_criu(
    host: Host, probe: Callable[[Criu], T], *, prefix: str = "", failed: str = ""
) -> T | Finding:
    """What `probe` finds with this host's CRIU, run as root; or the Finding saying why it
    could not run (`prefix` starts each such line, `failed` the line of a probe that raised)."""
    criu, _ = host.criu()
    if criu is None:
        return Finding(MISSING, f"{prefix}not checked: no usable CRIU", _SEE_CRIU)
    if (refused := _root()) is not None:
        return refused
    try:
        return probe(criu)
    except (ColdsnapError, OSError, subprocess.SubprocessError) as exc:
        return _missing(f"{prefix}{failed}{exc}")


def check_criu_check(host: Host) -> Finding:
    verdict = _with_criu(host, lambda criu: criu.check())
    if isinstance(verdict, Finding):
        return verdict
    return _ok(f"criu check: {verdict}")


def check_amx_patch(host: Host) -> Finding:
    if not _probe.cpu_has_amx():
        return Finding(NOT_APPLICABLE, "not needed (no AMX)")
    found = _with_criu(
        host, _probe.amx_restore_probe, prefix="AMX CPU; ", failed="the dump/restore probe failed: "
    )
    if isinstance(found, Finding):
        return found
    if not found.asked:
        return _missing(
            f"AMX CPU, but the kernel refused the AMX tile-data request ({found.request}, "
            f"permission {found.before:#x})"
        )
    if not found.kept:
        return _missing(
            f"AMX CPU, and a restored process lost its AMX permission ({found.before:#x} "
            f"before the dump, {found.after:#x} after the restore): CRIU lacks our restorer patch"
        )
    return _ok(f"AMX CPU: a restored process kept its AMX permission ({found.after:#x})")


def check_pid_restore(host: Host) -> Finding:
    criu, _ = host.criu()
    if criu is not None:
        try:
            if _probe.criu_feature(criu, "clone3_set_tid"):
                return _ok("clone3 with set_tid (criu check --feature clone3_set_tid)")
        except (ColdsnapError, OSError, subprocess.SubprocessError):
            pass  # the other way is checked next; the CRIU line says what is wrong with CRIU
    if _probe.ns_last_pid_writable():
        return _ok(f"{_probe.NS_LAST_PID} is writable")
    return _missing(f"neither clone3 set_tid nor a writable {_probe.NS_LAST_PID}")


def check_seccomp_filters(host: Host) -> Finding:
    supported = _with_criu(host, lambda criu: _probe.criu_feature(criu, "seccomp_filters"))
    if isinstance(supported, Finding):
        return supported
    if supported:
        return _ok("CRIU can dump seccomp filters (criu check --feature seccomp_filters)")
    return _missing("criu check --feature seccomp_filters fails")


def check_io_uring(host: Host) -> Finding:
    try:
        blocked, detail = _probe.io_uring_blocked()
    except (ColdsnapError, OSError, subprocess.SubprocessError) as exc:
        return _missing(f"the io_uring probe failed: {exc}")
    return _ok(detail) if blocked else _missing(detail)


_CPU_HOST = "CPU host: the CUDA checks do not apply"


def check_driver(host: Host) -> Finding:
    if not _probe.gpu_host():
        return Finding(NOT_APPLICABLE, _CPU_HOST)
    major = _probe.nvidia_driver_major()
    if major is None:
        return _missing(f"GPU host, but no driver version in {_probe.NVIDIA_VERSION}")
    if major < MIN_DRIVER:
        return _missing(f"NVIDIA driver {major}, below {MIN_DRIVER}")
    return _ok(f"NVIDIA driver {major}")


def check_cuda_checkpoint(host: Host) -> Finding:
    if not _probe.gpu_host():
        return Finding(NOT_APPLICABLE, _CPU_HOST)
    problem = CudaCheckpoint().problem()
    return _missing(problem) if problem else _ok("cuCheckpointProcess* API available")


def sglang_version() -> str | None:
    """The installed SGLang release (the overlay's, when one is active), None when it is not
    installed."""
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def sglang_report() -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The plugin's contract check of the SGLang an engine would run here: (problems as
    (group, message), contract key -> "<seen_in>:<variant>" in use). As the engine adapter
    does, a host without CUDA first activates SGLang's CPU support (and its overlay)."""
    import torch

    from coldsnap import plugin
    from coldsnap.engines.sglang import cpu

    with warnings.catch_warnings():  # SGLang warns at import about kernels this host lacks
        warnings.simplefilter("ignore", UserWarning)
        if not torch.cuda.is_available():
            cpu.activate()
        found = plugin.report()
    return list(found.problems), found.variants()


def _plugin_registered() -> bool:
    """Whether SGLang will load coldsnap's plugin here: its entry point is installed (read from
    the distributions' metadata, nothing imported)."""
    from coldsnap.plugin._contracts import ENTRY_POINT_GROUP, ENTRY_POINT_NAME

    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=ENTRY_POINT_NAME)
    return bool(found)


def check_sglang(host: Host) -> Finding:
    version = sglang_version()
    if version is None:
        return _missing("SGLang is not installed")
    if not _plugin_registered():
        return Finding(
            MISSING,
            f"SGLang {version}, but coldsnap's plugin entry point is not installed",
            "reinstall coldsnap into this environment (pip install -e .)",
        )
    if not host.contracts:
        # The contracts are checked by structure, which imports SGLang (10 s and more); every
        # capture checks them anyway, and admission checks a restore's install by its files.
        return _ok(f"SGLang {version} installed (contracts not checked: pass --contracts)")
    try:
        problems, variants = sglang_report()
    except OSError as exc:  # torch and SGLang make caches under HOME when they are imported
        return Finding(
            MISSING,
            f"SGLang does not import here: {exc.strerror}: {exc.filename}",
            "set HOME to a directory you can write (torch and SGLang keep caches there)",
        )
    except (ColdsnapError, ImportError, RuntimeError) as exc:
        return _missing(f"SGLang does not import here: {type(exc).__name__}: {exc}")
    if problems:
        return _missing(
            f"SGLang {version}: {len(problems)} contract(s) unmet: "
            + "; ".join(f"{group}: {message}" for group, message in problems)
        )
    other = sorted({v for v in variants.values() if not v.endswith(":default")})
    shape = f", variants {', '.join(other)}" if other else ", default variants"
    return _ok(f"SGLang {version}: {len(variants)} contracts met{shape}")


def check_store(host: Host) -> Finding:
    if host.store is None:
        return Finding(NOT_APPLICABLE, "no --store given")
    path = host.store
    if path.exists() and not path.is_dir():
        return _missing(f"{path} is not a directory")
    where = path
    while not where.exists():
        where = where.parent
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        return _missing(f"cannot write in {where}: {exc.strerror}")
    return _ok(f"{path} is writable" if where == path else f"{path} can be made in {where}")


CHECKS: tuple[Check, ...] = (
    Check("root", check_root, "run coldsnap as root (CRIU needs it)"),
    Check("criu", check_criu, "run scripts/setup-criu.sh, or set COLDSNAP_CRIU to a CRIU >= 4.2"),
    Check("criu-check", check_criu_check, "run `criu check --all` and fix what it names"),
    Check("amx-patch", check_amx_patch, "rebuild CRIU with our patch: scripts/setup-criu.sh"),
    Check("pid-restore", check_pid_restore, "use a kernel >= 5.5 (clone3 set_tid)"),
    Check("seccomp-filters", check_seccomp_filters, "use a kernel with PTRACE_SECCOMP_GET_FILTER"),
    Check("io-uring-filter", check_io_uring, "run on x86_64 with seccomp filters enabled"),
    Check("nvidia-driver", check_driver, f"install NVIDIA driver >= {MIN_DRIVER}"),
    Check("cuda-checkpoint", check_cuda_checkpoint, "pip install cuda-bindings; driver >= 580"),
    Check("sglang", check_sglang, "pip install an admitted SGLang (0.5.17 or 0.5.23)"),
    Check("store", check_store, "pass a --store directory you can write"),
)  # fmt: skip


@frozen
class Result:
    name: str
    status: str
    detail: str
    fix: str


def run_checks(host: Host, checks: tuple[Check, ...] = CHECKS) -> list[Result]:
    return [Result(c.name, (f := c.run(host)).status, f.detail, _fix(c, f)) for c in checks]


def _fix(check: Check, finding: Finding) -> str:
    if finding.status != MISSING:
        return ""
    return check.fix if finding.fix is None else finding.fix


def exit_code(results: list[Result]) -> int:
    return ENVIRONMENT_MISSING if any(r.status == MISSING for r in results) else OK


def text(results: list[Result]) -> str:
    width = max(len(r.name) for r in results)
    lines = []
    for r in results:
        fix = f"  -> fix: {r.fix}" if r.fix else ""
        lines.append(f"{r.status:<8} {r.name:<{width}}  {r.detail}{fix}")
    return "\n".join(lines)


@click.command("doctor")
@click.option("--store", type=click.Path(path_type=Path), help="Also check this store directory.")
@click.option(
    "--contracts", is_flag=True,
    help="Also check SGLang's contracts (imports SGLang: 10 s and more).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines.")
def doctor(store: Path | None, contracts: bool, as_json: bool) -> None:
    """Check this host: root, CRIU >= 4.2 and `criu check`, the AMX restorer patch (on AMX
    CPUs), CRIU's kernel features, the NVIDIA driver and CUDA checkpoint API (on GPU hosts),
    SGLang (its contracts with --contracts), the store. One line per requirement; exit 0 when
    all are met, 5 when something is missing."""
    results = run_checks(Host(store=store, contracts=contracts))
    code = exit_code(results)
    if as_json:
        rows = [attrs.asdict(r) for r in results]
        click.echo(json.dumps({"ok": code == OK, "exit_code": code, "checks": rows}, indent=2))
    else:
        click.echo(text(results))
    sys.exit(code)


__all__ = [
    "CHECKS",
    "Check",
    "Finding",
    "Host",
    "Result",
    "doctor",
    "exit_code",
    "run_checks",
    "text",
]
