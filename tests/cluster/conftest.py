from support.cluster_fixtures import crd_installed, operator, start_operator  # noqa: F401
