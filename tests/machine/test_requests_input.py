"""Bad numbers and names in a request are refused before anything starts, naming the field:
timeouts that are not finite positive seconds or that name no step of the operation, and a
model id that is a host path (the capsule records it for every host)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coldsnap.machine import RequestError, parse_request
from coldsnap.machine._convert import unstructure
from coldsnap.testing import MemoryWorld

from ._support import Gate, capture_request, memory_machine


def _data(tmp: Path) -> dict:
    return unstructure(capture_request(tmp))


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_timeout_that_is_not_a_finite_number_is_refused_naming_it(tmp_path, text) -> None:
    raw = json.dumps({**_data(tmp_path), "timeouts": {"process_dump": "T"}}).replace('"T"', text)
    with pytest.raises(RequestError) as caught:
        parse_request(json.loads(raw))  # Python's json reads NaN and Infinity as floats
    assert list(caught.value.fields) == ["timeouts.process_dump"], str(caught.value)
    assert "finite positive" in str(caught.value)  # the message says what is accepted


def test_a_timeout_naming_no_step_is_refused_before_any_side_effect(tmp_path) -> None:
    request = parse_request({**_data(tmp_path), "timeouts": {"no_such_step": 5}})
    world = MemoryWorld()
    with pytest.raises(RequestError) as caught:
        memory_machine(world, capture_request(tmp_path)).capture(request)
    assert list(caught.value.fields) == ["timeouts.no_such_step"]
    assert "process_dump" in str(caught.value)  # the steps it could name
    assert not (tmp_path / "cap").exists() and not world.transient()


def test_a_timeout_message_quotes_the_request_s_timeout(tmp_path) -> None:
    request = parse_request({**_data(tmp_path), "timeouts": {"process_dump": 0.2}})
    world = MemoryWorld()
    machine = memory_machine(world, request, grace_s=0.1)
    gate = Gate()
    gate.hold(machine.components["driver"], "dump")  # polls ctx.check() until the deadline
    try:
        receipt = machine.capture(request)
    finally:
        gate.open()
    assert receipt.failure is not None and receipt.failure.type == "StepTimeout"
    assert "ran past 0.2 s" in str(receipt.error)


@pytest.mark.parametrize("value", ["/models/tiny", "~/models/tiny", "./tiny", "C:\\models"])
@pytest.mark.parametrize("name", ["id", "revision"])
def test_a_model_id_or_revision_that_is_a_host_path_is_refused(tmp_path, name, value) -> None:
    data = _data(tmp_path)
    data["model"][name] = value
    with pytest.raises(RequestError) as caught:
        parse_request(data)
    assert list(caught.value.fields) == [f"model.{name}"] and "host path" in str(caught.value)


def test_a_hub_id_is_no_host_path(tmp_path) -> None:
    data = _data(tmp_path)
    data["model"]["id"] = "Qwen/Qwen3-0.6B"
    assert parse_request(data).model.id == "Qwen/Qwen3-0.6B"


def test_a_workdir_s_parents_need_not_exist_yet(tmp_path) -> None:
    """The journal makes the workdir with its parents, so a request printed before its
    default `ops/` folder exists reads back."""
    data = {**_data(tmp_path), "workdir": str(tmp_path / "ops" / "capture-1")}
    assert parse_request(data).workdir == str(tmp_path / "ops" / "capture-1")
    assert not (tmp_path / "ops").exists()
