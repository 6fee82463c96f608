"""Fixtures for tests on the sandbox's real kubelet node (tests/sandbox/realnode.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.cluster_fixtures import crd_installed, start_operator  # noqa: F401


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
