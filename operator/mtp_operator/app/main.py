"""`mtp-operator run`: assembles the operator process.

kopf (watches and handlers) plus, in the same event loop: the Alertmanager webhook receiver,
the built-in evaluator, the operator's /metrics and /healthz, and leader election.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import kopf
from aiohttp import web
from lightkube import AsyncClient
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mtp_operator.adapters.kube import KubeClient
from mtp_operator.adapters.telemetry import REGISTRY
from mtp_operator.addresses import parse_address
from mtp_operator.app import handlers, kopf_tweaks
from mtp_operator.control.alert_server import serve_alerts
from mtp_operator.control.evaluator import run_evaluator
from mtp_operator.control.leader import LeaderElector
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    settings: OperatorSettings
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    alerts_address: str | None = None
    alerts_token_file: Path | None = None
    alerts_tls_cert: Path | None = None
    alerts_tls_key: Path | None = None
    evaluator: bool | None = None  # None: the settings file decides
    evaluator_interval: float | None = None
    metrics_address: str | None = "0.0.0.0:8080"
    leader_election: bool = False
    lease_namespace: str = "default"
    lease_name: str = "mtp-operator"


async def _serve_metrics(address: str, ready: asyncio.Event) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: web.Request) -> web.Response:
        # liveness: the event loop answers (a follower waiting for the lease is healthy)
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # readiness: this replica acts (holds the lease, handlers running), so the webhook
        # Service sends alerts only to the leader
        return web.Response(
            text="ready" if ready.is_set() else "not leading",
            status=200 if ready.is_set() else 503,
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = parse_address(address)
    await web.TCPSite(runner, host, port).start()
    return runner


def in_cluster_server(info: kopf.ConnectionInfo,
                      environ: Mapping[str, str]) -> kopf.ConnectionInfo:
    """kopf's ServiceAccount login always names https://kubernetes.default.svc, which needs
    cluster DNS; client-go and lightkube take the API server from KUBERNETES_SERVICE_HOST and
    _PORT, which the kubelet sets in every pod. Both clients of this process use that address
    when it is there (hostNetwork pods without cluster DNS, a chart's extraEnv override)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return info
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return dataclasses.replace(info, server=f"https://{host}:{port}")


async def run(opts: RunOptions) -> int:
    # before kopf starts: O(n) instead of O(n^2) wake-ups while it indexes n objects
    kopf_tweaks.apply()
    client = AsyncClient(field_manager="mtp-operator")
    kube = KubeClient(client)
    view = handlers.KopfView()
    reconciler = Reconciler(kube, view, opts.settings)
    actions = RollbackActions(kube, view, reconciler)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, reconciler, view)

    @kopf.on.login(registry=registry)
    def _login(**kwargs: object) -> kopf.ConnectionInfo | None:
        # In a pod: the ServiceAccount; elsewhere: KUBECONFIG, as lightkube does.
        info = kopf.login_with_service_account(**kwargs)
        if info is not None:
            return in_cluster_server(info, os.environ)
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def _configure(settings: kopf.OperatorSettings, **_: object) -> None:
        handlers.configure(settings)

    ready = asyncio.Event()
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task] = []
    try:
        if opts.metrics_address:
            runners.append(await _serve_metrics(opts.metrics_address, ready))
        if opts.leader_election:
            elector = LeaderElector(client, opts.lease_namespace, opts.lease_name)
            await elector.acquire()
        if opts.alerts_address:
            runners.append(
                await serve_alerts(
                    opts.alerts_address,
                    opts.alerts_token_file,
                    opts.alerts_tls_cert,
                    opts.alerts_tls_key,
                    actions.apply_signals,
                )
            )
        evaluator_on = opts.settings.evaluator.enabled if opts.evaluator is None else opts.evaluator
        if evaluator_on:
            interval = opts.evaluator_interval or opts.settings.evaluator.interval_seconds
            tasks.append(asyncio.create_task(run_evaluator(actions, interval)))
        tasks.append(
            asyncio.create_task(handlers.resync_loop(reconciler, view, handlers.RESYNC_SECONDS))
        )
        operator = asyncio.create_task(
            kopf.operator(
                registry=registry,
                standalone=True,  # leader election above decides who acts, not kopf peering
                clusterwide=not opts.namespaces,
                namespaces=opts.namespaces,
            )
        )
        tasks.append(operator)
        ready.set()
        if opts.leader_election:
            keeper = asyncio.create_task(elector.keep())
            done, _ = await asyncio.wait({operator, keeper}, return_when=asyncio.FIRST_COMPLETED)
            if keeper in done:
                log.error("lost leadership; exiting so that only one replica acts")
                return 1
        await operator
        return 0
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for runner in runners:
            await runner.cleanup()
        await client.close()
