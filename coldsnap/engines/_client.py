"""The HTTP client for an engine's activation and acceptance endpoints (httpx + tenacity).

One seam: the httpx transport. Tests pass `httpx.MockTransport`; production uses the
default transport against the engine's HTTP port.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import attrs
import httpx
import tenacity

from coldsnap._errors import OperationError

from ._policy import EnginePolicy


class EngineError(OperationError, RuntimeError):
    """An engine call failed; names the operation, the HTTP status and the engine's words."""

    def __init__(self, operation: str, message: str, status: int | None = None) -> None:
        self.operation = operation
        self.status = status
        where = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{operation}{where}: {message}")


class AcceptanceError(EngineError):
    """The acceptance tokens differ from those recorded at capture."""

    def __init__(self, expected: Sequence[int], got: Sequence[int]) -> None:
        self.expected = tuple(expected)
        self.got = tuple(got)
        index = next(
            (i for i, (a, b) in enumerate(zip(self.expected, self.got, strict=False)) if a != b),
            min(len(self.expected), len(self.got)),
        )
        self.first_difference = index
        super().__init__(
            "acceptance",
            f"token ids differ from capture at position {index}: "
            f"expected {list(self.expected[index : index + 4])}..., "
            f"got {list(self.got[index : index + 4])}... "
            f"(lengths {len(self.expected)} and {len(self.got)})",
        )


@attrs.frozen
class Generation:
    token_ids: tuple[int, ...]
    text: str
    meta: dict[str, Any]


_RETRYABLE_STATUS = frozenset({502, 503, 504})


class _Retryable(Exception):
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        super().__init__(f"HTTP {response.status_code}")


class EngineClient:
    """Plain methods for each engine operation, spelled by `policy`; the engine adapters
    (coldsnap.engines.sglang) call them from the machine's steps."""

    def __init__(
        self,
        base_url: str,
        policy: EnginePolicy,
        *,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.policy = policy
        self._sleep = sleep
        t = policy.timeouts
        self._http = httpx.Client(
            base_url=base_url,
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(t.info, connect=t.connect),
            verify=_tls(),
        )

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(
        self,
        operation: str,
        method: str,
        path: str,
        *,
        timeout: float,
        json: Any = None,
        idempotent: bool,
        ok_status: tuple[int, ...] = (200,),
        single: bool = False,
    ) -> httpx.Response:
        """Sends with bounded retries and returns a response whose status is in ok_status.

        Only failures where the request cannot have reached the engine are retried for
        non-idempotent operations (a repeated release or resume would change state twice).
        `single`: one attempt, for a caller that polls on its own (a retry's back-off would
        notice a server that just came up late).
        """
        r = self.policy.retry
        retry_on: tuple[type[BaseException], ...] = (httpx.ConnectError, httpx.ConnectTimeout)
        if idempotent:
            retry_on += (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError, _Retryable)

        def once() -> httpx.Response:
            response = self._http.request(
                method,
                path,
                json=json,
                timeout=httpx.Timeout(timeout, connect=self.policy.timeouts.connect),
            )
            if (
                idempotent
                and response.status_code in _RETRYABLE_STATUS
                and response.status_code not in ok_status
            ):
                raise _Retryable(response)
            return response

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(1 if single else r.attempts),
            wait=tenacity.wait_exponential(multiplier=r.wait_initial, max=r.wait_max),
            retry=tenacity.retry_if_exception_type(retry_on),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            response = retrying(once)
        except _Retryable as exc:
            response = exc.response
        except httpx.HTTPError as exc:
            raise EngineError(operation, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code not in ok_status:
            raise EngineError(operation, _error_text(response), response.status_code)
        return response

    # ------------------------------------------------------------------ health
    def health(self, *, once: bool = False) -> bool:
        """True on 200, False on 503 (starting, or coldsnap's gate closed); raises otherwise."""
        response = self._call(
            "health", "GET", self.policy.endpoints.health,
            timeout=self.policy.timeouts.health, idempotent=True, ok_status=(200, 503),
            single=once,
        )  # fmt: skip
        return response.status_code == 200

    def ready(self, *, once: bool = False) -> bool:
        response = self._call(
            "ready", "GET", self.policy.endpoints.ready,
            timeout=self.policy.timeouts.health, idempotent=True, ok_status=(200, 503),
            single=once,
        )  # fmt: skip
        return response.status_code == 200

    def ping(self, *, once: bool = False) -> bool:
        """True on 200: the HTTP server serves. Asks nothing of the scheduler, so it answers at
        once; it says nothing of the engine's state where the engine answers 200 regardless
        (SGLang before /ready existed: 0.5.17), so callers pair it with another signal."""
        response = self._call(
            "ping", "GET", self.policy.endpoints.ping,
            timeout=self.policy.timeouts.health, idempotent=True, ok_status=(200, 503),
            single=once,
        )  # fmt: skip
        return response.status_code == 200

    def wait_healthy(
        self,
        timeout: float,
        *,
        interval: float = 0.25,
        check: Callable[[], None] | None = None,
    ) -> float:
        """Polls health until 200; `check` (a step context's check) may abort the wait."""
        start = time.monotonic()
        last: str = "no answer yet"
        while True:
            if check is not None:
                check()
            try:
                if self.health():
                    return time.monotonic() - start
                last = "HTTP 503"
            except EngineError as exc:
                last = str(exc)
            if time.monotonic() - start > timeout:
                raise EngineError("wait_healthy", f"not healthy after {timeout:g} s (last: {last})")
            self._sleep(interval)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        greedy: bool = True,
        sampling: dict[str, Any] | None = None,
    ) -> Generation:
        d = self.policy.dialect
        params: dict[str, Any] = dict(d.greedy) if greedy else {}
        params.update(sampling or {})
        params[d.max_tokens_key] = max_new_tokens
        body: dict[str, Any] = {d.sampling_field: params}
        if isinstance(prompt, str):
            body[d.text_field] = prompt
        else:
            body[d.ids_field] = [int(t) for t in prompt]
        response = self._call(
            "generate", "POST", self.policy.endpoints.generate,
            json=body, timeout=self.policy.timeouts.generate, idempotent=greedy,
        )  # fmt: skip
        data = _json(response, "generate")
        if not isinstance(data, dict) or not isinstance(data.get(d.output_ids_field), list):
            raise EngineError(
                "generate", f"answer has no list '{d.output_ids_field}': {str(data)[:200]}"
            )
        return Generation(
            token_ids=tuple(int(t) for t in data[d.output_ids_field]),
            text=str(data.get(d.output_text_field, "")),
            meta=dict(data.get(d.meta_field) or {}),
        )

    def acceptance_tokens(self) -> tuple[int, ...]:
        """Runs the policy's greedy acceptance request from an empty prefix cache; record its
        ids at capture. A prefill that reuses cached tokens computes the rest in other kernels
        and orders, and with random or near-tied logits that alone changes later tokens: a
        capture whose engine had served a prompt sharing the acceptance prompt's first tokens
        recorded ids a restore (whose cache is empty) could never reproduce."""
        self.flush_cache_when_idle()
        a = self.policy.acceptance
        return self.generate(a.prompt, max_new_tokens=a.max_new_tokens).token_ids

    def accept(self, expected: Sequence[int]) -> tuple[int, ...]:
        """Runs the acceptance request; raises AcceptanceError unless the ids equal `expected`."""
        got = self.acceptance_tokens()
        if tuple(got) != tuple(expected):
            raise AcceptanceError(expected, got)
        return got

    # ------------------------------------------------------------------ memory and weights
    def release(self, tags: Sequence[str] | None = None) -> None:
        """Releases memory regions (None: all of the policy's tags)."""
        body = {"tags": self.policy.check_tags(list(tags) if tags is not None else None)}
        self._call(
            "release", "POST", self.policy.endpoints.release,
            json=body, timeout=self.policy.timeouts.release, idempotent=False,
        )  # fmt: skip

    def resume(self, tags: Sequence[str] | None = None) -> None:
        """Resumes memory regions; with coldsnap's plugin this hydrates or recovers the weights."""
        body = {"tags": self.policy.check_tags(list(tags) if tags is not None else None)}
        self._call(
            "resume", "POST", self.policy.endpoints.resume,
            json=body, timeout=self.policy.timeouts.resume, idempotent=False,
        )  # fmt: skip

    def update_weights_from_disk(
        self,
        model_path: str,
        *,
        load_format: str | None = None,
        weight_version: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Reloads weights in place from a checkpoint directory; raises unless it succeeded."""
        body: dict[str, Any] = {**self.policy.update_defaults, "model_path": model_path, **extra}
        if load_format is not None:
            body["load_format"] = load_format
        if weight_version is not None:
            body["weight_version"] = weight_version
        response = self._call(
            "update_weights_from_disk", "POST", self.policy.endpoints.update_weights_from_disk,
            json=body, timeout=self.policy.timeouts.update_weights, idempotent=False,
            ok_status=(200, 400),
        )  # fmt: skip
        data = _json(response, "update_weights_from_disk")
        if not isinstance(data, dict) or not data.get("success"):
            message = data.get("message") if isinstance(data, dict) else data
            raise EngineError("update_weights_from_disk", str(message), response.status_code)
        return data

    def flush_cache(self) -> None:
        self._call(
            "flush_cache", "POST", self.policy.endpoints.flush_cache,
            timeout=self.policy.timeouts.flush_cache, idempotent=True,
        )  # fmt: skip

    def flush_cache_when_idle(self) -> None:
        """Flushes the prefix cache, asking again while the engine refuses because a request
        still runs (HTTP 400: a server that just turned healthy may still be answering its own
        warm-up request), within the flush timeout; a refusal past it raises."""

        def once() -> httpx.Response:
            return self._call(
                "flush_cache", "POST", self.policy.endpoints.flush_cache,
                timeout=self.policy.timeouts.flush_cache, idempotent=True, ok_status=(200, 400),
            )  # fmt: skip

        response = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.policy.timeouts.flush_cache),
            wait=tenacity.wait_fixed(0.1),
            retry=tenacity.retry_if_result(lambda r: r.status_code == 400),
            sleep=self._sleep,
            retry_error_callback=lambda state: state.outcome.result(),
        )(once)
        if response.status_code != 200:
            raise EngineError("flush_cache", _error_text(response), response.status_code)

    def weights_checksum(self) -> dict[str, Any]:
        """The engine's own per-tensor checksums of the served weights (bit-exact comparisons)."""
        response = self._call(
            "weights_checksum", "POST", self.policy.endpoints.weights_checker,
            json={"action": "checksum"}, timeout=self.policy.timeouts.info, idempotent=True,
        )  # fmt: skip
        data = _json(response, "weights_checksum")
        if not isinstance(data, dict) or not data.get("success"):
            raise EngineError("weights_checksum", str(data)[:500], response.status_code)
        return data

    def server_info(self) -> dict[str, Any]:
        response = self._call(
            "server_info", "GET", self.policy.endpoints.server_info,
            timeout=self.policy.timeouts.info, idempotent=True,
        )  # fmt: skip
        return _json(response, "server_info")

    def model_info(self) -> dict[str, Any]:
        response = self._call(
            "model_info", "GET", self.policy.endpoints.model_info,
            timeout=self.policy.timeouts.info, idempotent=True,
        )  # fmt: skip
        return _json(response, "model_info")


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context for every client of this process: httpx builds a new one per
    client otherwise, loading the CA bundle (about 40 ms on a 2-core host), and a restore makes a
    client in each of its engine steps."""
    return httpx.create_ssl_context()


def _json(response: httpx.Response, operation: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise EngineError(
            operation, f"answer is not JSON: {response.text[:200]!r}", response.status_code
        ) from None


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return str(data)[:500]
