"""Fixtures for tests on the sandbox's real kubelet node (tests/sandbox/realnode.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_lib.common import port_free
from support.cluster_fixtures import crd_installed, get_json, start_operator, wait_for  # noqa: F401
from support.cpu_node import PORTS, make_gpu_node, unmake_gpu_node


@pytest.fixture(scope="session")
def real_node(sandbox) -> Iterator[object]:
    """The real node, started on the session's sandbox on first use, stopped (nothing left
    behind: the stop raises otherwise) at the end of the session."""
    from realnode import RealNode

    node = RealNode(sandbox).start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def cpu_gpu_node(real_node, kubectl):
    """The real node labelled and sized like a one-GPU node of product CPU-VLLM."""
    # vLLM binds the node's IP (see the test), the exporter every address. Both servers set
    # SO_REUSEADDR (uvicorn, http.server), so the check does too: the previous real-node test's
    # connections to the same ports sit in TIME_WAIT for a minute, which only a bind without
    # SO_REUSEADDR refuses. A process of that test still exiting gets 60 s to go.
    for host, port in ((real_node.ip, PORTS[0]), ("0.0.0.0", PORTS[1])):
        wait_for(lambda h=host, p=port: port_free(p, h), 60,
                 message=f"port {host}:{port} free on this host (a hostNetwork pool needs it)")
    make_gpu_node(kubectl, real_node)
    yield real_node
    unmake_gpu_node(kubectl, real_node)
