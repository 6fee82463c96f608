"""The class-aware endpoint picker on the sandbox (issue 39, item 4).

The operator renders an MTPInference with three traffic classes (a header class, a
prompt-length class, a default class) into class pools, the InferencePool `<name>-pool` and the
picker's ConfigMap `<name>-epp-config`; kwok makes the pool pods Ready with pod IPs. The picker
(runtime/picker: the Gateway API Inference Extension v1.5.0 EPP runner plus our
`mtp-traffic-class-filter`, built once by runtime/picker/build.sh and cached by a hash of its
sources) runs against the sandbox's API server with the rendered config as it is, watches the
real InferencePool and its pods, and answers Envoy's ext-proc gRPC API. The probe
(runtime/picker/cmd/extproc-probe) sends each request as Envoy does (headers, then the body)
and reads the endpoint the picker chose (`x-gateway-destination-endpoint`). vLLM's /metrics is
served on every pod IP with one pod of each class loaded (20 requests waiting) and one idle: the
scorers alone would pick any idle pod, so each request landing on the idle pod of its own class
shows the class filter first and the scorers after it (without the filter in the profile this
test fails at its first request).

A missing Go toolchain or a failed build fails the test (no skip).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

import support.mtpi as mtpi_helpers
from support.cluster_fixtures import get_json, wait_for
from support.fake_vllm import FakeVLLM

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "runtime" / "picker" / "build.sh"
NAME = "classes"
CLASS_LABEL = "mtp-operator.io/traffic-class"
CLASSES = [
    {"name": "code", "header": {"name": "X-MTP-Class", "value": "code"},
     "numSpeculativeTokens": 2},
    {"name": "short", "promptTokens": {"max": 127}, "numSpeculativeTokens": 4},
    {"name": "general", "numSpeculativeTokens": 3},  # the default class
]
REPLICAS = 2


@pytest.fixture(scope="session")
def picker_binaries() -> Path:
    """The folder with mtp-picker and extproc-probe: built on the first call for this state
    of runtime/picker (minutes cold), found in ~/.cache/mtp-operator/picker-<hash> after."""
    p = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"runtime/picker/build.sh failed:\n{p.stderr[-4000:]}"
    folder = Path(p.stdout.strip().splitlines()[-1].removeprefix("PICKER_DIR="))
    assert (folder / "mtp-picker").is_file() and (folder / "extproc-probe").is_file(), folder
    return folder


def _free_port() -> int:
    from sandbox import free_port

    return free_port()


class Picker:
    """mtp-picker as a process: the rendered config, the real InferencePool, admin kubeconfig."""

    def __init__(self, binary: Path, kubeconfig: Path, namespace: str, config: Path,
                 log: Path) -> None:
        self.grpc_port, self.metrics_port, health = _free_port(), _free_port(), _free_port()
        self.log = log
        args = [str(binary), "--pool-name", f"{NAME}-pool", "--pool-namespace", namespace,
                "--config-file", str(config), "--grpc-port", str(self.grpc_port),
                "--grpc-health-port", str(health), "--metrics-port", str(self.metrics_port),
                "--metrics-endpoint-auth=false", "--tracing=false", "--enable-pprof=false",
                "--v=2"]
        self._out = open(log, "wb")  # closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                                     start_new_session=True)

    def queues(self) -> dict[str, float]:
        """{endpoint: waiting requests} as the picker's datastore holds them (its per-pod
        metric; an endpoint is `<pod>-rank-<i>`, one per target port)."""
        assert self.proc.poll() is None, f"the picker exited:\n{self.tail()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {line.split('model_server_pod="', 1)[1].split('"', 1)[0]:
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("inference_pool_per_pod_queue_size{")}

    def serving(self) -> bool:
        """The ext-proc gRPC port accepts connections (it opens after the controllers start)."""
        try:
            socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1).close()
            return True
        except OSError:
            return False

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._out.close()


def _probe(probe: Path, port: int, prompt_chars: int, headers: dict[str, str]) -> dict:
    args = [str(probe), "--addr", f"127.0.0.1:{port}", "--prompt-chars", str(prompt_chars)]
    for k, v in headers.items():
        args += ["-H", f"{k}={v}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {
        "error": p.stderr}


# (what the request carries, prompt characters (the picker estimates tokens as chars / 4),
#  the class it must land in)
CASES = [
    ({"x-mtp-class": "code"}, 40, "code"),        # the header class
    ({"x-mtp-class": "code"}, 4000, "code"),      # the header wins over the length
    ({}, 40, "short"),                            # 10 tokens: the length class
    ({}, 508, "short"),                           # 127 tokens: the range's upper end
    ({"x-mtp-class": "other"}, 100, "short"),     # an unknown header value: by length
    ({}, 512, "general"),                         # 128 tokens: no range, the default class
    ({}, 4000, "general"),                        # 1000 tokens
]


@pytest.mark.timeout(1800)  # a cold build of the picker takes minutes on 2 cores
def test_the_picker_routes_each_request_to_a_pod_of_its_class(
        inference_pool_crd, picker_binaries, kubectl, kubeconfig, namespace, operator,
        tmp_path):
    mtpi_helpers.apply(kubectl, namespace, NAME, model="org/model", replicas=REPLICAS,
                       tensorParallelSize=1, gpuProducts=[mtpi_helpers.H100],
                       speculative={"classes": CLASSES})
    mtpi_helpers.wait_ready(kubectl, namespace, NAME)
    pool = get_json(kubectl, "inferencepool", f"{NAME}-pool", "-n", namespace)
    config = tmp_path / "config.yaml"
    cm = wait_for(lambda: get_json(kubectl, "configmap", f"{NAME}-epp-config", "-n", namespace),
                  30, message="the picker's ConfigMap")
    config.write_text(cm["data"]["config.yaml"])
    assert "mtp-traffic-class-filter" in config.read_text()

    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    pods = get_json(kubectl, "pods", "-n", namespace, "-l", selector)["items"]
    by_class: dict[str, list[dict]] = {}
    for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
        assert mtpi_helpers.condition(p, "Ready").get("status") == "True", p["metadata"]["name"]
        by_class.setdefault(p["metadata"]["labels"][CLASS_LABEL], []).append(p)
    assert {c: len(ps) for c, ps in by_class.items()} == {
        c["name"]: REPLICAS for c in CLASSES}, by_class
    port = pool["spec"]["targetPorts"][0]["number"]

    # vLLM's /metrics on every pod IP: in each class one pod has 20 requests waiting, the other
    # none. Left to its scorers the picker would send a request to any of the 4 idle pods; with
    # the class filter first it must pick the idle pod of the request's class.
    fakes, want_queues, idle = [], {}, {}
    for c, ps in by_class.items():
        for i, p in enumerate(ps):
            fake = FakeVLLM(host=p["status"]["podIP"], port=port).start()
            fakes.append(fake)
            fake.waiting = 20.0 if i == 0 else 0.0
            want_queues[f'{p["metadata"]["name"]}-rank-0'] = fake.waiting
        idle[c] = ps[1]["status"]["podIP"]
    picker = Picker(picker_binaries / "mtp-picker", Path(kubeconfig), namespace, config,
                    tmp_path / "picker.log")
    try:
        wait_for(lambda: picker.queues() == want_queues and picker.serving(), 60,
                 message="the picker to hold every pool pod with its queue, ext-proc open")
        for headers, chars, want in CASES:
            for _ in range(2):
                got = _probe(picker_binaries / "extproc-probe", picker.grpc_port, chars,
                             headers)
                assert not got.get("error"), (got, picker.tail())
                assert got["metadataEndpoint"] == got["endpoint"], got
                assert got["endpoint"] == f"{idle[want]}:{port}", (
                    f"{headers} + {chars} chars: picked {got['endpoint']}, not the idle {want} "
                    f"pod {idle[want]} (idle pods by class: {idle})")
        assert picker.proc.poll() is None, picker.tail()
    finally:
        picker.stop()
        for fake in fakes:
            fake.stop()


def test_the_filters_go_unit_tests_pass(picker_binaries):
    """runtime/picker's Go unit tests (the filter's class rule, its parameters, the operator's
    rendered config through the EPP's own loader); Go caches a passing result, so a warm run
    costs nothing."""
    p = subprocess.run(["nice", "-n", "10", "go", "test", "./..."], cwd=BUILD.parent,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]

