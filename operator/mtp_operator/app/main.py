"""`mtp-operator run`: assembles the operator process.

kopf (watches and handlers) plus, in the same event loop: the Alertmanager webhook receiver,
the built-in evaluator, the operator's /metrics and /healthz, and leader election.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import kopf
from aiohttp import web
from lightkube import AsyncClient, ConfigError, KubeConfig
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mtp_operator.adapters.api_writes import ApiWrites
from mtp_operator.adapters.kube import KubeClient
from mtp_operator.adapters.namespaces import NamespaceOptIn
from mtp_operator.adapters.telemetry import REGISTRY, count_gc_seconds
from mtp_operator.addresses import parse_address
from mtp_operator.app import handlers, kopf_tweaks
from mtp_operator.control.alert_server import serve_alerts
from mtp_operator.control.evaluator import run_evaluator
from mtp_operator.control.heap import keep_heap_frozen
from mtp_operator.control.leader import LeaderElector
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.control.supervision import Health, run_with_crd, supervise
from mtp_operator.control.tuner import run_tuner
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


class StartupError(RuntimeError):
    """The operator cannot start as configured; the message is one line saying why."""


def preflight(opts: RunOptions) -> None:
    """Check what `run` needs before anything starts, so that a mistake is one clear line."""
    for flag, address in (
        ("--metrics-address", opts.metrics_address),
        ("--alerts-address", opts.alerts_address),
    ):
        if address:
            try:
                parse_address(address)
            except ValueError as err:
                raise StartupError(f"{flag}: {err}") from None
    for flag, path in (
        ("--alerts-token-file", opts.alerts_token_file),
        ("--alerts-tls-cert", opts.alerts_tls_cert),
        ("--alerts-tls-key", opts.alerts_tls_key),
    ):
        if path is not None and not Path(path).is_file():
            raise StartupError(f"{flag}: {path}: no such file")
    if bool(opts.alerts_tls_cert) != bool(opts.alerts_tls_key):
        raise StartupError("--alerts-tls-cert and --alerts-tls-key go together")
    try:
        KubeConfig.from_env()
    except ConfigError as err:
        raise StartupError(f"no Kubernetes configuration: {err} (set KUBECONFIG)") from None


async def _bind(what: str, address: str, start: Awaitable[web.AppRunner]) -> web.AppRunner:
    try:
        return await start
    except OSError as err:
        raise StartupError(f"{what} {address}: {err.strerror or err}") from None


async def _serve_metrics(address: str, health: Health) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: web.Request) -> web.Response:
        # liveness: the event loop answers (a follower waiting for the lease is healthy)
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # readiness: this replica acts (holds the lease, the CRD is served, the cluster is
        # indexed, every background task runs), so the webhook Service sends alerts only to it
        problems = health.problems()
        return web.Response(
            text="; ".join(problems) if problems else "ready", status=503 if problems else 200
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = parse_address(address)
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


class _NotFoundWithoutTraceback(logging.Filter):
    """kopf logs a watch that hits a deleted CRD (404) with two tracebacks; the operator
    pauses on it (control/supervision.py), so one line each is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is not None and type(err).__name__ == "APINotFoundError":
            record.exc_info, record.exc_text = None, None
        return True


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
    for name in ("kopf._core.reactor.orchestration", "kopf._core.reactor.running"):
        logging.getLogger(name).addFilter(_NotFoundWithoutTraceback())
    # The writes of ordinary passes (applies, status patches, Events: a rollout's ~7 a
    # resource) go over aiohttp's keep-alive connections, at a third of httpx's CPU a request
    # (adapters/api_writes.py); an alert's writes (adapters/kube.urgent_writes), lists,
    # deletes and the leader lease over lightkube's one HTTP/2 connection. Both from one
    # configuration, so they reach and authenticate alike.
    config = KubeConfig.from_env().get()
    client = AsyncClient(config=config, field_manager="mtp-operator", http2=True)
    writes = ApiWrites.from_config(config)
    count_gc_seconds()
    kube = KubeClient(client, writes)
    view = handlers.KopfView()
    reconciler = Reconciler(kube, view, opts.settings)
    # the webhook acts only in namespaces that opted in (issue 36), unless the settings say not
    opted_in = (NamespaceOptIn(kube.namespace_labels)
                if opts.settings.alerts.require_namespace_opt_in else None)
    actions = RollbackActions(kube, view, reconciler, namespace_opted_in=opted_in)
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
        handlers.configure(settings, opts.settings.list_page_size)

    health = Health(lambda: view.ready)
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task] = []

    def run_kopf(stop: asyncio.Event) -> Awaitable[None]:
        return kopf.operator(
            registry=registry,
            standalone=True,  # leader election above decides who acts, not kopf peering
            clusterwide=not opts.namespaces,
            namespaces=opts.namespaces,
            stop_flag=stop,
        )

    def paused() -> None:
        view.reset()
        reconciler.reset()

    def crd_served() -> Awaitable[bool]:
        return kube.crd_served(opts.namespaces[0] if opts.namespaces else None)

    try:
        if opts.metrics_address:
            address = opts.metrics_address
            runners.append(await _bind("metrics", address, _serve_metrics(address, health)))
        if opts.leader_election:
            elector = LeaderElector(client, opts.lease_namespace, opts.lease_name)
            await elector.acquire()
        health.leading = True
        if opts.alerts_address:
            serving = serve_alerts(
                opts.alerts_address,
                opts.alerts_token_file,
                opts.alerts_tls_cert,
                opts.alerts_tls_key,
                actions.apply_signals,
                max_alert_age=opts.settings.alerts.max_alert_age_seconds,
            )
            runners.append(await _bind("alerts", opts.alerts_address, serving))
        evaluator_on = opts.settings.evaluator.enabled if opts.evaluator is None else opts.evaluator
        if evaluator_on:
            interval = opts.evaluator_interval or opts.settings.evaluator.interval_seconds
            evaluate = functools.partial(run_evaluator, actions, interval)
            tasks.append(asyncio.create_task(supervise("evaluator", evaluate, health)))
        # measured K (spec.speculative.tuning): idle unless a resource turns it on
        scrape_every = opts.evaluator_interval or opts.settings.evaluator.interval_seconds
        tune = functools.partial(run_tuner, reconciler, view, kube, scrape_every)
        tasks.append(asyncio.create_task(supervise("tuner", tune, health)))
        resync = functools.partial(
            handlers.resync_loop, reconciler, view, handlers.RESYNC_SECONDS
        )
        tasks.append(asyncio.create_task(supervise("resync", resync, health)))
        # the watched objects left out of the collector's full passes (control/heap.py)
        heap = functools.partial(keep_heap_frozen, lambda: view.ready)
        tasks.append(asyncio.create_task(supervise("heap", heap, health)))
        # before kopf starts: O(n) instead of O(n^2) wake-ups while it indexes n objects,
        # watch events without managedFields, and pods, Services and listed pool Deployments
        # not held at the start-up gate (after the ports are bound, so that a start-up
        # mistake is the only line printed)
        kopf_tweaks.apply()
        kopf_tweaks.slim_watch_events(projections=handlers.WATCH_PROJECTIONS)
        kopf_tweaks.index_only_kinds_skip_the_gate(listed=handlers.LISTED_WITHOUT_THE_GATE)
        operator = asyncio.create_task(run_with_crd(crd_served, run_kopf, paused, health))
        tasks.append(operator)
        if opts.leader_election:
            keeper = asyncio.create_task(elector.keep())
            done, _ = await asyncio.wait({operator, keeper}, return_when=asyncio.FIRST_COMPLETED)
            if keeper in done:
                log.error("lost leadership; exiting so that only one replica acts")
                return 1
        try:
            await operator
        except Exception as err:  # kopf itself failed: exit non-zero, say why
            log.error("the operator's watches failed: %s: %s", type(err).__name__, err)
            return 1
        return 0  # kopf stops only when told to (SIGTERM, SIGINT)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for runner in runners:
            await runner.cleanup()
        await writes.close()
        await client.close()
