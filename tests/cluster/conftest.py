from support.cluster_fixtures import (  # noqa: F401
    crd_installed,
    inference_pool_crd,
    lws_controller,
    operator,
    start_operator,
)
