"""One repository of an OCI registry, over the distribution API, through oras-py.

oras-py (`oras.provider.Registry`) parses references, reads credentials as docker and oras do
and answers the registry's challenges: `~/.docker/config.json` (and `$DOCKER_CONFIG/config.json`
when DOCKER_CONFIG is set; oras-py reads the former too, so with both a host's entry may come
from either), their `credsStore` and `credHelpers`, `ORAS_USER`/`ORAS_PASS`; Basic or bearer
tokens, chosen by the registry's answer to `GET /v2/` as docker does. Its requests are retried
on connection errors (three tries here, not oras-py's five over two minutes).

What oras-py does not do, done here over its requests: a blob larger than one chunk is sent as
a chunked upload (POST, PATCH per chunk, PUT) read piece by piece from the store (oras-py's
monolithic upload reads a whole blob into memory), and a failed PATCH resumes from the offset
the registry reports for the session (oras-py's chunked upload starts over); a download that
breaks resumes with a Range request. Neither survives the process: a push run again skips the
blobs the registry already holds whole, and sends the others from their start.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# oras.provider first: it loads oras.container, oras.decorator and oras.utils in the order they
# need (importing oras.decorator first fails on a circular import)
import oras.provider
import requests
from attrs import frozen

from coldsnap.artifacts import digest_problem

from ._errors import ArtifactRefused, RegistryError
from ._mapping import MANIFEST_MEDIA_TYPE, Blob

CHUNK_BYTES = 16 << 20
"""One PATCH of a chunked upload; a blob up to this size is sent in one PUT."""
ATTEMPTS = 3
"""Tries of one piece: a PATCH resumed from the registry's offset, a GET resumed by Range."""
TIMEOUT_S = (10.0, 300.0)
"""Seconds to connect, and to wait for the next bytes of an answer: a registry that stops
answering fails the command instead of holding it forever (oras-py sets no timeout)."""
_OCTETS = "application/octet-stream"
_REGISTRY = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?|\[[0-9A-Fa-f:]+\](:[0-9]+)?")


@frozen
class Reference:
    """Where an artifact is: `registry` (host[:port]), `repository`, and a `tag` or a
    `digest` (a digest wins when both are given, as docker's)."""

    registry: str
    repository: str
    tag: str
    digest: str | None = None

    @property
    def target(self) -> str:
        return self.digest or self.tag

    def __str__(self) -> str:
        at = f"@{self.digest}" if self.digest else f":{self.tag}"
        return f"{self.registry}/{self.repository}{at}"


def parse_reference(text: str) -> Reference:
    """`HOST[:PORT]/REPOSITORY[:TAG][@DIGEST]` (tag `latest` when none); ValueError saying what
    is wrong. The registry must be named: coldsnap has no default registry."""
    host, slash, rest = text.partition("/")
    if not slash or not rest or not _REGISTRY.fullmatch(host):
        raise ValueError(f"{text!r} does not name a registry: write HOST[:PORT]/REPOSITORY[:TAG]")
    if "." not in host and ":" not in host and host != "localhost":
        raise ValueError(
            f"{text!r}: {host!r} is not a registry host (a host has a '.' or a ':port', or is "
            "localhost): write HOST[:PORT]/REPOSITORY[:TAG]"
        )
    match = oras.container.docker_regex.fullmatch(rest)
    if match is None:
        raise ValueError(f"{text!r} is not a reference: write HOST[:PORT]/REPOSITORY[:TAG]")
    parts = match.groupdict()
    if parts["registry"]:
        raise ValueError(f"{text!r}: the repository {rest!r} looks like a second registry")
    repository = (parts["namespace"] or "") + parts["repository"]
    if repository != repository.lower():
        raise ValueError(f"{text!r}: a repository name is lowercase")
    digest = parts["digest"]
    if digest is not None and (problem := digest_problem(digest)):
        raise ValueError(f"{text!r}: {problem}")
    return Reference(host, repository, parts["tag"] or "latest", digest)


class _Oras(oras.provider.Registry):
    """oras-py's client, with fewer retries of a failed request (its own wait 3 to 83 s
    between five tries: an unreachable registry took over two minutes to say so)."""

    do_request = oras.decorator.retry(attempts=ATTEMPTS - 1, timeout=1)(
        oras.provider.Registry.do_request.__wrapped__
    )


def docker_configs(environ: dict[str, str] | None = None) -> list[str]:
    """The docker config files to read credentials from besides oras-py's own
    (`~/.docker/config.json`): `$DOCKER_CONFIG/config.json` when DOCKER_CONFIG is set."""
    folder = (os.environ if environ is None else environ).get("DOCKER_CONFIG")
    return [str(Path(folder) / "config.json")] if folder else []


class Repository:
    """The repository a reference names, on its registry: `plain_http` for a registry served
    without TLS (a test's, a local mirror's)."""

    def __init__(self, ref: Reference, *, plain_http: bool = False) -> None:
        self.ref = ref
        self._base = f"{'http' if plain_http else 'https'}://{ref.registry}/v2/{ref.repository}"
        backend = self._auth_backend(f"{'http' if plain_http else 'https'}://{ref.registry}/v2/")
        self._oras = _Oras(hostname=ref.registry, insecure=plain_http, auth_backend=backend)
        session = self._oras.session
        session.request = functools.partial(session.request, timeout=TIMEOUT_S)  # type: ignore[method-assign]
        container = oras.container.Container(f"{ref.registry}/{ref.repository}:{ref.tag}")
        self._oras.auth.load_configs(container, configs=docker_configs())
        # oras-py's Basic backend keeps what it found in `_basic_auth` (none: no attribute, and
        # an AttributeError at the first challenge): say what is missing before any request
        if backend == "basic" and not getattr(self._oras.auth, "_basic_auth", None):
            raise RegistryError(
                f"the registry {ref.registry} asks for credentials and none were found: "
                f"`docker login {ref.registry}` (~/.docker/config.json, or $DOCKER_CONFIG/"
                "config.json), or ORAS_USER and ORAS_PASS"
            )

    def _auth_backend(self, ping: str) -> str:
        """How the registry asks for credentials, from its answer to `GET /v2/` (as docker
        pings): `basic` for a Basic challenge, else `token` (bearer, or none asked)."""
        try:
            answer = requests.get(ping, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise RegistryError(f"cannot reach the registry {self.ref.registry}: {exc}") from None
        challenge = answer.headers.get("Www-Authenticate", "")
        return "basic" if challenge.lower().startswith("basic") else "token"

    # blobs --------------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        answer = self._request("HEAD", f"{self._base}/blobs/{digest}")
        if answer.status_code == 200:
            return True
        if answer.status_code == 404:
            return False
        raise self._failed(answer, f"asking for blob {digest}")

    def upload(self, path: Path, blob: Blob, progress: Callable[[int], None]) -> None:
        """Sends the file at `path` as `blob`: in one PUT up to CHUNK_BYTES, else chunk by
        chunk (`_patch_all`)."""
        session = self._start_upload(blob.digest)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if blob.size > CHUNK_BYTES:
                session = self._patch_all(fd, path, blob, session, progress)
                body = b""
            else:
                body = _read(fd, 0, blob.size, path)
        finally:
            os.close(fd)
        closing = self._request(
            "PUT", _with_digest(session, blob.digest), data=body,
            headers={"Content-Type": _OCTETS, "Content-Length": str(len(body))},
        )  # fmt: skip
        if closing.status_code != 201:
            raise self._failed(closing, f"sending blob {blob.digest}")
        if body:
            progress(len(body))

    def _start_upload(self, digest: str) -> str:
        """A new upload session's URL."""
        started = self._request("POST", f"{self._base}/blobs/uploads/",
                                headers={"Content-Length": "0"})  # fmt: skip
        if started.status_code != 202:
            raise self._failed(started, f"starting the upload of {digest}")
        return self._location(started)

    def _patch_all(
        self, fd: int, path: Path, blob: Blob, session: str, progress: Callable[[int], None]
    ) -> str:
        """PATCHes the blob chunk by chunk; the session's URL to close it with. A chunk that
        fails (up to ATTEMPTS times in a row) resumes from the offset the registry reports
        for the session; where it cannot report one (distribution refuses a session URL whose
        state is older than the upload, as after an answer lost on the way back), the blob
        starts again in a new session. `progress` is told each byte once."""
        offset, tries, told = 0, 0, 0
        while offset < blob.size:
            n = min(CHUNK_BYTES, blob.size - offset)
            data = _read(fd, offset, n, path)
            try:
                answer = self._request(
                    "PATCH", session, data=data,
                    headers={"Content-Type": _OCTETS, "Content-Length": str(n),
                             "Content-Range": f"{offset}-{offset + n - 1}"},
                )  # fmt: skip
            except RegistryError as exc:
                why = str(exc)
            else:
                if answer.status_code == 202:
                    session, offset, tries = self._location(answer), offset + n, 0
                    if offset > told:
                        progress(offset - told)
                        told = offset
                    continue
                why = _reason(answer)
            tries += 1
            if tries >= ATTEMPTS:
                raise RegistryError(
                    f"sending blob {blob.digest}: bytes {offset}- failed {tries} times: {why}"
                )
            try:
                session, offset = self._upload_status(session, blob.digest)
            except RegistryError:
                session, offset = self._start_upload(blob.digest), 0
        return session

    def _upload_status(self, session: str, digest: str) -> tuple[str, int]:
        """Where an upload session stands: its URL and the bytes the registry holds (its
        Range `0-N` holds N + 1 bytes; `0-0` is read as none, as a session this client
        started holds none or a whole chunk)."""
        answer = self._request("GET", session)
        if answer.status_code != 204:
            raise self._failed(answer, f"asking how far the upload of {digest} went")
        held = re.fullmatch(r"(?:bytes=)?0-([0-9]+)", answer.headers.get("Range", ""))
        end = int(held[1]) if held else 0
        return self._location(answer), end + 1 if end else 0

    def download(
        self, blob: Blob, write: Callable[[bytes], None], progress: Callable[[int], None]
    ) -> None:
        """Streams `blob` into `write`, resuming with a Range request where the stream broke;
        ArtifactRefused when the registry serves more or fewer bytes than its size."""
        url, got, tries = f"{self._base}/blobs/{blob.digest}", 0, 0
        while True:
            headers = {"Range": f"bytes={got}-"} if got else {}
            try:
                answer = self._request("GET", url, headers=headers, stream=True)
                with answer:
                    if answer.status_code != (206 if got else 200):
                        raise self._failed(answer, f"fetching blob {blob.digest}")
                    for piece in answer.iter_content(1 << 20):
                        if got + len(piece) > blob.size:
                            raise ArtifactRefused(
                                f"{self.ref}: blob {blob.digest} is longer than its "
                                f"{blob.size} bytes"
                            )
                        write(piece)
                        got += len(piece)
                        progress(len(piece))
                break
            except requests.RequestException as exc:
                tries += 1
                if tries >= ATTEMPTS:
                    raise RegistryError(
                        f"fetching blob {blob.digest} from {self.ref.registry} failed {tries} "
                        f"times, at byte {got}: {exc}"
                    ) from None
        if got != blob.size:
            raise ArtifactRefused(
                f"{self.ref}: blob {blob.digest} has {got} bytes, its descriptor says {blob.size}"
            )

    def fetch_small(self, blob: Blob, limit: int = 64 << 20) -> bytes:
        """A small blob (a capsule's manifest), whole, checked against its digest."""
        if blob.size > limit:
            raise ArtifactRefused(f"{self.ref}: blob {blob.digest} is {blob.size} bytes, over "
                                  f"the {limit} a capsule's manifest may have")  # fmt: skip
        pieces: list[bytes] = []
        self.download(blob, pieces.append, lambda n: None)
        data = b"".join(pieces)
        if "sha256:" + hashlib.sha256(data).hexdigest() != blob.digest:
            raise ArtifactRefused(f"{self.ref}: blob {blob.digest} does not hash to its digest")
        return data

    # manifests ----------------------------------------------------------------------------

    def manifest(self) -> tuple[bytes, str]:
        """The manifest the reference names, its bytes and digest (checked against the
        reference's digest when it names one)."""
        answer = self._request("GET", f"{self._base}/manifests/{self.ref.target}",
                               headers={"Accept": MANIFEST_MEDIA_TYPE})  # fmt: skip
        if answer.status_code != 200:
            raise self._failed(answer, f"fetching the manifest {self.ref}")
        data = answer.content
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if self.ref.digest is not None and digest != self.ref.digest:
            raise ArtifactRefused(f"{self.ref}: the manifest served hashes to {digest}")
        return data, digest

    def put_manifest(self, data: bytes) -> str:
        """Puts the manifest under the reference's tag; its digest."""
        answer = self._request(
            "PUT", f"{self._base}/manifests/{self.ref.tag}", data=data,
            headers={"Content-Type": MANIFEST_MEDIA_TYPE, "Content-Length": str(len(data))},
        )  # fmt: skip
        if answer.status_code != 201:
            raise self._failed(answer, f"putting the manifest {self.ref}")
        return "sha256:" + hashlib.sha256(data).hexdigest()

    # requests -----------------------------------------------------------------------------

    def _request(self, method: str, url: str, **kw: Any) -> requests.Response:
        try:
            return self._oras.do_request(url, method, **kw)
        except (requests.RequestException, ValueError) as exc:
            # oras-py raises ValueError for a 500 after its retries and for a challenge it
            # cannot answer (no credentials for a registry that asks for them)
            raise RegistryError(f"{method} {url}: {exc}") from None

    def _location(self, answer: requests.Response) -> str:
        where = answer.headers.get("Location", "")
        if not where:
            raise self._failed(answer, "an upload session (no Location)")
        if where.startswith("/"):
            return self._base.split("/v2/", 1)[0] + where
        return where

    def _failed(self, answer: requests.Response, doing: str) -> RegistryError:
        return RegistryError(f"{doing} on {self.ref.registry}: {_reason(answer)}")


def _reason(answer: requests.Response) -> str:
    """The registry's own words for a refusal (the distribution API's error codes), with the
    HTTP status."""
    words = ""
    try:
        errors = answer.json().get("errors", [])
        words = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    except (ValueError, AttributeError):
        pass
    if answer.status_code in (401, 403) and not words:
        words = "credentials refused or missing (docker login, or ~/.docker/config.json)"
    return f"HTTP {answer.status_code}" + (f" ({words})" if words else "")


def _with_digest(session: str, digest: str) -> str:
    return str(oras.utils.append_url_params(session, {"digest": digest}))


def _read(fd: int, offset: int, n: int, path: Path) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise RegistryError(f"{path}: {len(data)} bytes at {offset}, expected {n} (it shrank)")
    return data


__all__ = ["ATTEMPTS", "CHUNK_BYTES", "Reference", "Repository", "docker_configs",
           "parse_reference"]  # fmt: skip
