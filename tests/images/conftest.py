import warnings

import pytest

from support.cluster_fixtures import crd_installed  # noqa: F401
from support.images import (
    container,  # noqa: F401
    remove_stale_containers,
)


@pytest.fixture(scope="session", autouse=True)
def _no_stale_test_containers() -> None:
    """A pytest run killed mid-test leaves its containers; they are removed before this run's
    image tests start, and said so."""
    stale = remove_stale_containers()
    if stale:
        warnings.warn(f"removed {len(stale)} test container(s) an earlier run left: {stale}",
                      stacklevel=1)
