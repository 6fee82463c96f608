"""One replica over several nodes: a LeaderWorkerSet group's pod finds its place. Pure.

A multi-node pool is a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) of N pods, one per node.
The LWS controller gives every container of a group (sigs.k8s.io/lws v0.7.0,
pkg/utils/pod/pod_utils.go AddLWSVariables):

- `LWS_LEADER_ADDRESS`: the leader pod's DNS name (`<lws>-<group>.<subdomain>.<namespace>`);
- `LWS_GROUP_SIZE`: pods in the group (the LWS `size`);
- `LWS_WORKER_INDEX`: this pod's index, 0 for the leader.

vLLM 0.33 runs one engine over nodes with its multiprocessing backend (engine/arg_utils.py:
`--nnodes`/`-n`, `--node-rank`/`-r`, `--master-addr`, `--master-port`; entrypoints/cli/
serve.py: `--headless` runs a node's workers without an API server): every pod runs the same
`vllm serve` line (tensor x pipeline parallel over all the group's GPUs, `--nnodes N`), the
leader with `--node-rank 0` serves the API, the others add `--node-rank i --headless`, and all
meet at the leader's `--master-addr`/`--master-port` for torch.distributed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mtp_runtime.problems import Problem, problems_text

LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
# vLLM 0.33's ParallelConfig.master_port default; named so every pod of a group agrees
MASTER_PORT = 29501


class GroupError(ValueError):
    """The pod's LWS environment does not give it a place in an N-node group."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(problems_text(problems))


@dataclass(frozen=True)
class GroupRole:
    node_rank: int
    nnodes: int
    leader_address: str

    @property
    def leader(self) -> bool:
        return self.node_rank == 0


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env.get(name, ""))
    except ValueError:
        return None


def group_role(env: Mapping[str, str], nnodes: int) -> GroupRole | None:
    """This pod's place in its group, or None for a one-node pool (no flags to add)."""
    if nnodes <= 1:
        return None
    problems: list[Problem] = []
    address = (env.get(LEADER_ADDRESS_ENV) or "").strip()
    size, index = _int(env, GROUP_SIZE_ENV), _int(env, WORKER_INDEX_ENV)
    if not address:
        problems.append(Problem(LEADER_ADDRESS_ENV, "not set: the pod is not in a "
                                "LeaderWorkerSet group, which a multi-node pool needs"))
    if size != nnodes:
        problems.append(Problem(GROUP_SIZE_ENV, f"{env.get(GROUP_SIZE_ENV)!r}: the pool's "
                                f"settings need a group of {nnodes} pods"))
    if index is None or not 0 <= index < nnodes:
        problems.append(Problem(WORKER_INDEX_ENV, f"{env.get(WORKER_INDEX_ENV)!r}: must be "
                                f"0 (the leader) to {nnodes - 1}"))
    if problems:
        raise GroupError(problems)
    assert index is not None
    return GroupRole(index, nnodes, address)


def group_args(role: GroupRole | None) -> list[str]:
    """The flags one pod of the group adds to the pool's `vllm serve` line."""
    if role is None:
        return []
    out = ["--node-rank", str(role.node_rank), "--master-addr", role.leader_address,
           "--master-port", str(MASTER_PORT)]
    return out if role.leader else [*out, "--headless"]
