"""`coldsnap restore --replica`: the request carries it (by NAME and over a request file), and a
driver that does not declare `pid_namespaces` is refused naming the field before anything
starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import Capsule, Member, Store, to_json
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.cli import main
from coldsnap.machine import REGISTRY, RequestError, RestoreRequest


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _publish(store: Store, tag: str) -> None:
    record = CaptureRecord(driver="n610", provider="native", engine="sglang", model_id="m",
                           revision="local", facts={}, serve_port=30000)  # fmt: skip
    data = to_json(record)
    members = (
        Member("process-image", "image/files.img", store.put_bytes(b"image"), 5),
        Member("record", RECORD_NAME, store.put_bytes(data), len(data)),
    )
    store.publish(Capsule(members=members, identity=None), tag=tag)


def test_restore_by_name_carries_replica_only_when_given(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny")
    plain = cli("restore", "tiny", "--store", str(store.root), "--print-request")
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["replica"] is False
    replica = cli("restore", "tiny", "--store", str(store.root), "--port", "30001", "--replica",
                  "--print-request")  # fmt: skip
    assert replica.exit_code == 0, replica.output
    assert json.loads(replica.stdout)["replica"] is True
    assert json.loads(replica.stdout)["port"] == 30001


def test_replica_goes_with_a_request_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny")
    request = {"kind": "coldsnap.restore-request", "driver": "n610", "provider": "native",
               "artifact": "tiny", "workdir": str(tmp_path / "op"), "store": str(store.root)}
    (tmp_path / "r.json").write_text(json.dumps(request))
    shown = cli("restore", str(tmp_path / "r.json"), "--replica", "--print-request")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["replica"] is True


def _request(tmp_path: Path, driver: str) -> RestoreRequest:
    return RestoreRequest(driver=driver, provider="native", artifact="tiny", replica=True,
                          workdir=str(tmp_path / "op"), store=str(tmp_path / "store"))  # fmt: skip


def test_a_driver_without_pid_namespaces_refuses_a_replica_naming_the_field(
    tmp_path: Path,
) -> None:
    lacking = [d for d in REGISTRY.names("driver")
               if "pid_namespaces" not in REGISTRY.capabilities("driver", d)]  # fmt: skip
    assert lacking, "every registered driver declares pid_namespaces: nothing to refuse"
    with pytest.raises(RequestError, match=r"replica.*pid_namespaces"):
        REGISTRY.check(_request(tmp_path, lacking[0]))
    offering = [d for d in REGISTRY.names("driver")
                if "pid_namespaces" in REGISTRY.capabilities("driver", d)]  # fmt: skip
    assert offering
    REGISTRY.check(_request(tmp_path, offering[0]))  # no RequestError
