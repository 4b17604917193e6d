"""A real OCI registry for the tests: the CNCF distribution registry of Debian's
`docker-registry` package (scripts/setup.sh installs it), on 127.0.0.1 at a free port, its
blobs in a folder the test owns, stopped when the test is done."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests._support import free_port

BINARY = "docker-registry"


def registry_binary() -> str:
    """The registry's binary; skips the test where it is not installed."""
    found = shutil.which(BINARY) or (
        "/usr/bin/docker-registry" if Path("/usr/bin/docker-registry").exists() else None
    )
    if found is None:
        pytest.skip(
            "no OCI registry to test against: Debian's docker-registry package is not "
            "installed (scripts/setup.sh installs it; apt-get install docker-registry)"
        )
    return found


@contextlib.contextmanager
def serve_registry(root: Path, login: tuple[str, str] | None = None) -> Iterator[str]:
    """Serves a registry whose storage is `root`/data; yields its `127.0.0.1:PORT`. With
    `login` (user, password), it asks for them (Basic, an htpasswd file)."""
    binary = registry_binary()
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    auth = ""
    if login is not None:
        (root / "htpasswd").write_text(f"{login[0]}:{_bcrypt(login[1])}\n")
        auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {root / 'htpasswd'}\n"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n" + auth
    )
    log = (root / "registry.log").open("wb")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/v2/", timeout=2)
                if answer.status_code in (200, 401):  # 401: it serves, and asks for a login
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the registry did not start: " + (root / "registry.log").read_text()[-2000:]
                )
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _bcrypt(password: str) -> str:
    """The bcrypt hash the registry's htpasswd wants, from the C library (Python's crypt
    module, deprecated but in 3.11; no bcrypt package needed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    # the fewest rounds bcrypt takes: the registry checks the hash at every request
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def blob_file(root: Path, digest: str) -> Path:
    """Where the registry serving from `root` keeps a blob's bytes (its filesystem driver's
    layout), for tests that damage one."""
    hexdigest = digest.removeprefix("sha256:")
    return root / "data/docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"
