"""`coldsnap doctor`: one line per requirement, exit 5 when one is missing. Each requirement's
missing case is made by faking the probe its check reads (a CRIU binary that answers like an
old or broken one, the AMX dump/restore probe, the driver's version, SGLang's contracts); the
rest of the host is faked as healthy so that each test sees exactly one cause."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.backends import Criu, CudaCheckpoint, _probe
from coldsnap.cli import _doctor, main

pytestmark = pytest.mark.xdist_group("toys")

FAKE_CRIU = """#!/bin/sh
case "$1" in
  --version) echo "Version: {version}" ;;
  check) {check} ;;
esac
"""


def fake_criu(tmp_path: Path, version: str = "4.2.1", check: str = 'echo "Looks good."') -> Path:
    path = tmp_path / "criu"
    path.write_text(FAKE_CRIU.format(version=version, check=check))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def healthy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A host where every requirement is met: root, a good CRIU (a fake binary found through
    COLDSNAP_CRIU), an AMX CPU whose restored process keeps its permission, the features, a GPU
    with driver 580 and the checkpoint API, SGLang with its contracts met."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("COLDSNAP_CRIU", str(fake_criu(tmp_path)))
    monkeypatch.setattr(_probe, "cpu_has_amx", lambda: True)
    monkeypatch.setattr(
        _probe, "amx_restore_probe", lambda criu: _probe.AmxProbe(0, 0x600E7, 0x600E7)
    )
    monkeypatch.setattr(_probe, "ns_last_pid_writable", lambda: True)
    monkeypatch.setattr(_probe, "io_uring_blocked", lambda: (True, "ENOSYS"))
    monkeypatch.setattr(_probe, "gpu_host", lambda: True)
    monkeypatch.setattr(_probe, "nvidia_driver_major", lambda: 580)
    monkeypatch.setattr(CudaCheckpoint, "problem", lambda self: None)
    monkeypatch.setattr(_doctor, "sglang_version", lambda: "0.5.23")
    monkeypatch.setattr(
        _doctor, "sglang_report", lambda: ([], {"a": "0.5.23:default", "b": "0.5.17:old"})
    )
    return monkeypatch


def doctor(*args: str) -> tuple[Result, dict[str, tuple[str, str]]]:
    """Runs `coldsnap doctor --json ARGS`; returns the result and name -> (status, detail)."""
    result = CliRunner().invoke(main, ["doctor", "--json", *args])
    rows = json.loads(result.stdout)["checks"]
    return result, {r["name"]: (r["status"], r["detail"]) for r in rows}


def only_missing(checks: dict[str, tuple[str, str]], *names: str) -> None:
    missing = {n for n, (status, _) in checks.items() if status == "missing"}
    assert missing == set(names), checks


def test_all_ok_prints_one_line_per_requirement_and_exits_0(
    healthy: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        main, ["doctor", "--contracts", "--store", str(tmp_path / "store")]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines] == [c.name for c in _doctor.CHECKS]
    assert all(line.split()[0] == "ok" for line in lines), result.stdout
    assert "-> fix:" not in result.stdout
    by_name = {line.split()[1]: line for line in lines}
    assert "CRIU 4.2.1" in by_name["criu"]
    assert "kept its AMX permission" in by_name["amx-patch"]
    assert "NVIDIA driver 580" in by_name["nvidia-driver"]
    assert "SGLang 0.5.23: 2 contracts met, variants 0.5.17:old" in by_name["sglang"]
    assert "can be made in" in by_name["store"]


def test_json_output(healthy: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(main, ["doctor", "--json"])
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["ok"] is True and out["exit_code"] == 0
    assert out["checks"][0] == {
        "name": "root",
        "status": "ok",
        "detail": "running as root",
        "fix": "",
    }
    assert {r["name"]: r["status"] for r in out["checks"]}["store"] == "n/a"


def test_a_missing_requirement_exits_5_with_its_fix(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 5
    line = next(x for x in result.stdout.splitlines() if x.split()[1] == "root")
    assert (
        line.startswith("missing") and "uid 1000" in line and "-> fix: run coldsnap as root" in line
    )


def test_not_root(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(os, "geteuid", lambda: 1000)
    result, checks = doctor()
    assert result.exit_code == 5
    # what needs root to be checked says so instead of passing
    only_missing(checks, "root", "criu-check", "amx-patch", "seccomp-filters")
    assert checks["criu-check"][1] == "not checked: needs root (running as uid 1000)"


def test_criu_missing(healthy: pytest.MonkeyPatch, tmp_path: Path) -> None:
    healthy.setenv("COLDSNAP_CRIU", str(tmp_path / "no-such-criu"))
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "criu", "criu-check", "amx-patch", "seccomp-filters")
    assert "cannot run" in checks["criu"][1] and "no-such-criu" in checks["criu"][1]
    assert checks["criu-check"][1] == "not checked: no usable CRIU"
    assert checks["pid-restore"][0] == "ok"  # ns_last_pid, read without CRIU


def test_criu_too_old(healthy: pytest.MonkeyPatch, tmp_path: Path) -> None:
    healthy.setenv("COLDSNAP_CRIU", str(fake_criu(tmp_path, version="3.19")))
    result, checks = doctor()
    assert result.exit_code == 5
    assert checks["criu"][0] == "missing" and "is CRIU 3.19.0, below 4.2" in checks["criu"][1]


def test_criu_check_failing(healthy: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fails = 'echo "Error (criu/cr-check.c:1): seccomp is not supported" >&2; exit 1'
    healthy.setenv("COLDSNAP_CRIU", str(fake_criu(tmp_path, check=fails)))
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "criu-check", "seccomp-filters")
    assert "seccomp is not supported" in checks["criu-check"][1]
    assert checks["pid-restore"][0] == "ok"  # clone3 refused too; ns_last_pid is writable


def test_amx_host_with_unpatched_criu(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(_probe, "amx_restore_probe", lambda criu: _probe.AmxProbe(0, 0x600E7, 0x200E7))
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "amx-patch")
    assert "0x600e7 before the dump, 0x200e7 after the restore" in checks["amx-patch"][1]
    assert "lacks our restorer patch" in checks["amx-patch"][1]


def test_amx_not_needed_without_amx(healthy: pytest.MonkeyPatch) -> None:
    def never(criu: Criu) -> _probe.AmxProbe:
        raise AssertionError("no probe on a CPU without AMX")

    healthy.setattr(_probe, "cpu_has_amx", lambda: False)
    healthy.setattr(_probe, "amx_restore_probe", never)
    result, checks = doctor()
    assert result.exit_code == 0
    assert checks["amx-patch"] == ("n/a", "not needed (no AMX)")


def test_no_pid_restore_feature(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(_probe, "criu_feature", lambda criu, name: name != "clone3_set_tid")
    healthy.setattr(_probe, "ns_last_pid_writable", lambda: False)
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "pid-restore")


def test_io_uring_not_blocked(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(_probe, "io_uring_blocked", lambda: (False, "io_uring_setup succeeded"))
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "io-uring-filter")


def test_driver_too_old(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(_probe, "nvidia_driver_major", lambda: 570)
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "nvidia-driver")
    assert checks["nvidia-driver"][1] == "NVIDIA driver 570, below 580"


def test_cuda_checkpoint_api_missing(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(CudaCheckpoint, "problem", lambda self: "cuda-bindings is not installed")
    result, checks = doctor()
    assert result.exit_code == 5
    only_missing(checks, "cuda-checkpoint")


def test_cpu_host_skips_the_cuda_checks(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(_probe, "gpu_host", lambda: False)
    result, checks = doctor()
    assert result.exit_code == 0
    cpu = ("n/a", "CPU host: the CUDA checks do not apply")
    assert checks["nvidia-driver"] == checks["cuda-checkpoint"] == cpu


def test_sglang_not_installed(healthy: pytest.MonkeyPatch) -> None:
    healthy.setattr(_doctor, "sglang_version", lambda: None)
    result, checks = doctor()
    assert result.exit_code == 5
    assert checks["sglang"] == ("missing", "SGLang is not installed")


def test_sglang_contracts_unmet(healthy: pytest.MonkeyPatch) -> None:
    unmet = [("scheduler hooks", "sglang.srt.managers.scheduler.Scheduler.x: no such attribute")]
    healthy.setattr(_doctor, "sglang_report", lambda: (unmet, {}))
    result, checks = doctor("--contracts")
    assert result.exit_code == 5
    only_missing(checks, "sglang")
    assert "1 contract(s) unmet: scheduler hooks: sglang.srt" in checks["sglang"][1]


def test_store_not_writable(healthy: pytest.MonkeyPatch, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result, checks = doctor("--store", str(not_a_dir))
    assert result.exit_code == 5
    only_missing(checks, "store")
    assert checks["store"][1] == f"{not_a_dir} is not a directory"


def test_each_check_is_data_with_a_fix() -> None:
    names = [c.name for c in _doctor.CHECKS]
    assert len(set(names)) == len(names)
    assert all(isinstance(c.run, Callable) and c.fix for c in _doctor.CHECKS)  # type: ignore[arg-type]


@pytest.mark.criu
def test_the_amx_probe_dumps_and_restores_for_real() -> None:
    """The real probe on this host: on an AMX CPU the restored process keeps its permission
    (our CRIU is patched); elsewhere the kernel refuses the request and nothing is asked."""
    criu = Criu()
    if problem := criu.problem():
        pytest.skip(f"no usable CRIU >= 4.2: {problem}")
    found = _probe.amx_restore_probe(criu)
    if _probe.cpu_has_amx():
        assert found.asked and found.kept, found
    else:
        assert not found.asked and found.after == found.before, found


def test_the_io_uring_probe_for_real() -> None:
    blocked, detail = _probe.io_uring_blocked()
    assert blocked, detail
