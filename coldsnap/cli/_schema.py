"""JSON Schemas of the request files, generated from the attrs request classes, so that the
documented form cannot drift from the one `parse_request` accepts (docs/schema/*.json, checked
by a test; `coldsnap schema capture|restore|stop|sleep|wake [--write]`)."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import attrs

from coldsnap.machine import (
    CaptureRequest,
    RestoreRequest,
    SleepRequest,
    StopRequest,
    WakeRequest,
)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schema"
CLASSES: dict[str, type] = {
    "capture": CaptureRequest,
    "restore": RestoreRequest,
    "stop": StopRequest,
    "sleep": SleepRequest,
    "wake": WakeRequest,
}

_ABOUT: dict[str, str] = {
    "kind": "what this file is",
    "format": "the request format's version",
    "driver": "n610 (the whole process and its CUDA state) or n580 (a pre-exec template, the "
    "engine built at restore); see docs/drivers.md",
    "provider": "native (the weights exported into the capsule) or recovery (reloaded from the "
    "pinned checkpoint)",
    "engine": "the engine adapter",
    "model": "the model, pinned by id and revision, and where its checkpoint lies on this host",
    "model.id": "the model's id (a Hugging Face id or any name)",
    "model.revision": "the revision the capsule binds (a commit, a tag, any pin)",
    "model.path": "absolute path of the checkpoint directory on this host",
    "workdir": "absolute path of this operation's directory: journal, receipt, logs (its parent "
    "must exist)",
    "store": "absolute path of the capsule store (its parent must exist)",
    "name": "the tag the capsule is published under",
    "artifact": "the capsule to restore: a tag or a sha256:<hex> digest",
    "engine_args": "the engine's command-line flags, as in its own command line; --host and "
    "--port are coldsnap's and refused here",
    "engine_options": "the engine's own knobs by name, as strings (the engine adapter refuses "
    "a key it does not know, naming it); the capsule binds them and a restore must name the "
    "same",
    "tp": "the tensor-parallel size (capture: the engine gets it as --tp-size, which engine_args "
    "must not set; restore: refuse a capsule captured with another)",
    "port": "the TCP port the restored engine serves on (default: the capture's serve_port, "
    "else the port it served on at capture)",
    "host": "the IPv4 address the restored engine listens on (default: the capture's "
    "serve_host, else 127.0.0.1)",
    "serve_port": "the --port of the launch command line captured: restores serve there by "
    "default (the capture itself serves on a port coldsnap picks)",
    "serve_host": "the --host (IPv4) of the launch command line captured: restores listen there "
    "by default",
    "keep_source": "leave the captured engine running after the capture",
    "timeouts": "seconds per step name, replacing the spec's timeout for that step",
    "target": "absolute path of the workdir of the capture or restore whose engine this acts on",
}


def _type_schema(kind: Any, path: str) -> dict[str, Any]:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return {}
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a, path) for a in args if a is not type(None)]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        if type(None) in args:
            schema = {"anyOf": [schema, {"type": "null"}]}
        return schema
    if kind is str:
        return {"type": "string"}
    if kind is bool:
        return {"type": "boolean"}
    if kind is int:
        return {"type": "integer"}
    if kind is float:
        return {"type": "number"}
    if origin in (tuple, list):
        return {"type": "array", "items": _type_schema(args[0] if args else Any, path)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(args[1], path)}
    if attrs.has(kind):
        return _object_schema(kind, f"{path}.")
    raise TypeError(f"{path}: no JSON Schema for {kind!r}")


def _object_schema(cls: type, prefix: str = "") -> dict[str, Any]:
    attrs.resolve_types(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        path = f"{prefix}{field.name}"
        schema = _type_schema(field.type, path)
        if field.name in ("kind", "format"):
            schema = {**schema, "const": field.default}
        if path in _ABOUT:
            schema = {"description": _ABOUT[path], **schema}
        if field.default is attrs.NOTHING:
            required.append(field.name)
        elif not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            schema["default"] = (
                list(field.default) if isinstance(field.default, tuple) else (field.default)
            )
        properties[field.name] = schema
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


object_schema = _object_schema
"""The JSON Schema of an attrs class (the `--json` events' too, coldsnap.cli._events)."""


def schema(operation: str) -> dict[str, Any]:
    """The JSON Schema of a `operation` request file."""
    cls = CLASSES[operation]
    body = _object_schema(cls)
    body["required"] = ["kind", *body["required"]]  # the parser tells requests apart by kind
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://coldsnap.dev/schema/{operation}-request.json",
        "title": f"coldsnap {operation} request",
        "description": (cls.__doc__ or "").strip(),
        **body,
    }


def text(operation: str) -> str:
    return json.dumps(schema(operation), indent=2) + "\n"


def path(operation: str) -> Path:
    return SCHEMA_DIR / f"{operation}-request.schema.json"


__all__ = ["CLASSES", "SCHEMA_DIR", "object_schema", "path", "schema", "text"]
