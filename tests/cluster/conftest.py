from support.cluster_fixtures import (  # noqa: F401
    crd_installed,
    lws_controller,
    operator,
    start_operator,
)
