"""Whether a namespace has opted in to rollbacks from the alert webhook (issue 36, what one
token may do): its Namespace carries `mtp-operator.io/alert-rollback: "enabled"`
(naming.LABEL_ALERT_ROLLBACK). Read with one GET (`namespaces get`, the chart's ClusterRole)
and kept OPT_IN_CACHE_SECONDS, so a burst of alerts costs one read per namespace and a label
added or taken off counts within that time. Only namespaces that hold an MTPInference the
operator knows are ever read (control/rollback.py checks the target first), so a token holder
naming made-up namespaces makes no request and no cache entry.

A GET instead of a watch: alerts are rare, the answer is needed only then, and a watch of
every Namespace would be one more cluster-wide list held in memory for it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

from mtp_operator.naming import ALERT_ROLLBACK_ENABLED, LABEL_ALERT_ROLLBACK

OPT_IN_CACHE_SECONDS = 10.0
MAX_CACHED_NAMESPACES = 10_000

# namespace name -> its labels, or None when there is no such namespace (404)
ReadLabels = Callable[[str], Awaitable[Mapping[str, str] | None]]


class NamespaceOptIn:
    """`await opted_in(namespace)`: True when the namespace's label says `enabled`. A read
    that fails raises (the request answers 500 and Alertmanager retries) and is not kept."""

    def __init__(
        self,
        read_labels: ReadLabels,
        *,
        ttl: float = OPT_IN_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_CACHED_NAMESPACES,
    ) -> None:
        self._read, self._ttl, self._clock, self._max = read_labels, ttl, clock, max_entries
        self._answers: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    async def __call__(self, namespace: str) -> bool:
        now = self._clock()
        kept = self._answers.get(namespace)
        if kept is not None and now - kept[0] < self._ttl:
            return kept[1]
        labels = await self._read(namespace)
        answer = (labels or {}).get(LABEL_ALERT_ROLLBACK) == ALERT_ROLLBACK_ENABLED
        self._answers[namespace] = (now, answer)
        self._answers.move_to_end(namespace)
        while len(self._answers) > self._max:
            self._answers.popitem(last=False)
        return answer
