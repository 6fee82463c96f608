"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

The holder renews the Lease every `renew_seconds`; another replica takes it over only after
`lease_seconds` without a renewal. Updates carry the resourceVersion they read, so two
replicas racing for an expired Lease cannot both win (the API server answers 409 to one).
A leader that finds another holder on the Lease stops acting (the caller exits).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import UTC, datetime, timedelta

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from mtp_operator.adapters.kube import TransportError

log = logging.getLogger(__name__)


def default_identity() -> str:
    """The pod's name (POD_NAME, set by the chart from the downward API), else host-pid. Not
    the host name alone: pods with hostNetwork share the node's host name, and each is PID 1
    in its own container, so two replicas on one host would hold the Lease as one."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _expired(lease: Lease, now: datetime) -> bool:
    spec = lease.spec
    if spec is None or not spec.holderIdentity:
        return True
    renewed = spec.renewTime or spec.acquireTime
    if renewed is None:
        return True
    if renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=UTC)
    return now - renewed > timedelta(seconds=spec.leaseDurationSeconds or 15)


class LeaderElector:
    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str = "mtp-operator",
        identity: str | None = None,
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds

    async def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease. True when we hold it afterwards."""
        now = datetime.now(UTC)
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise
            fresh = Lease(
                metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                spec=LeaseSpec(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=self.lease_seconds,
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=0,
                ),
            )
            try:
                await self.client.create(fresh)
            except ApiError as create_err:
                if create_err.status.code == 409:  # another replica created it first
                    return False
                raise
            return True
        spec = lease.spec or LeaseSpec()
        ours = spec.holderIdentity == self.identity
        if not ours and not _expired(lease, now):
            return False
        if not ours:
            spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
            spec.acquireTime = now
        spec.holderIdentity = self.identity
        spec.leaseDurationSeconds = self.lease_seconds
        spec.renewTime = now
        lease.spec = spec
        try:
            await self.client.replace(lease)  # carries resourceVersion: a lost race is a 409
        except ApiError as err:
            if err.status.code == 409:
                return False
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease."""
        announced = False
        while True:
            try:
                if await self.try_acquire():
                    log.info(
                        "leader election: %s holds lease %s/%s",
                        self.identity,
                        self.namespace,
                        self.name,
                    )
                    return
            except (ApiError, TransportError, OSError) as err:
                log.warning("leader election: %s", err)
            if not announced:
                log.info("leader election: waiting for lease %s/%s", self.namespace, self.name)
                announced = True
            await asyncio.sleep(self.renew_seconds)

    async def keep(self) -> None:
        """Renew until another replica holds the Lease; then return (leadership lost).

        While the API server is unreachable nobody can take the Lease over, so renewal
        errors only log and retry: an API outage must not cost the operator its leadership
        (it reconnects and carries on without a restart).
        """
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if not await self.try_acquire():
                    log.error("leader election: lease %s taken by another replica", self.name)
                    return
            except (ApiError, TransportError, OSError) as err:
                log.warning("leader election: renewal failed, retrying: %s", err)
