"""leader.LeaderElector.keep(): an API server that is away (connection refused, timeouts, as
lightkube raises them) must not cost the leader its lease; another holder on the Lease does."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

import httpx2
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from mtp_operator.control.leader import LeaderElector


class AwayThenTaken:
    """get() fails like a stopped/slow API server `errors` times, then shows another holder."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def get(self, *_: object, **__: object) -> Lease:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        now = datetime.now(UTC)
        return Lease(
            metadata=ObjectMeta(name="mtp-operator", namespace="ns", resourceVersion="1"),
            spec=LeaseSpec(holderIdentity="other", leaseDurationSeconds=15, renewTime=now),
        )


def test_keep_rides_out_an_api_outage_and_stops_when_another_replica_holds_the_lease():
    request = httpx2.Request("GET", "https://127.0.0.1:1/")
    client = AwayThenTaken([
        httpx2.ConnectError("connection refused", request=request),
        httpx2.ReadTimeout("timed out", request=request),
        httpx2.RemoteProtocolError("server disconnected", request=request),
    ])
    elector = LeaderElector(client, "ns", identity="me", renew_seconds=0.01)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(elector.keep(), 5))
    assert client.calls == 4


def test_identity_is_the_pod_name_when_set(monkeypatch) -> None:
    """hostNetwork replicas share the host name and are both PID 1: only POD_NAME tells them
    apart."""
    from mtp_operator.control.leader import default_identity

    monkeypatch.setenv("POD_NAME", "mtp-operator-7d9f-abcde")
    assert default_identity() == "mtp-operator-7d9f-abcde"
    monkeypatch.delenv("POD_NAME")
    assert default_identity().endswith(f"-{os.getpid()}")
