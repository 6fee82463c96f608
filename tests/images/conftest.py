from support.cluster_fixtures import crd_installed  # noqa: F401
from support.images import container  # noqa: F401
