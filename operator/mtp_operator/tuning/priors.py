"""Step-cost priors: the shape of u(K) measured at real size on a GPU family. Pure.

The tuner fits u(K) = base + K·perToken (seconds per request-step, `estimator`) from a pool's
own windows, which takes windows at two K >= 1 — one trial spent on the fit alone. On a GPU
family measured at real size (bench/results/gpu/realsize.md, `bench/gpu/realsize_summary.py`)
the line's *shape* is known per concurrency; a pool with windows at one K >= 1 then gets a
fit from that shape scaled to its own measured step cost, and its first trial can go straight
to the K the estimate favours. Estimates on a prior are never adoptable on their own: a K is
adopted only from its own windows (`Estimate.adoptable`), so a wrong prior costs a trial,
never a wrong K.

PRIORS holds, per family, (concurrency, base ms, per-token ms) lines of the 27B-class hybrid
model fitted over K >= 1 at the reference acceptance; tests/unit/bench/test_measured_profiles.py
holds them to the committed bench/results/gpu/realsize.json.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mtp_runtime.gpu_profiles import product_family

from .estimator import CostFit, Measurement, pooled


@dataclass(frozen=True)
class CostPrior:
    family: str
    source: str  # where the lines were measured (GPU, model, results file)
    lines: tuple[tuple[float, float, float], ...]  # (concurrency, base ms, per-token ms)

    def line_at(self, concurrency: float | None) -> tuple[float, float, float]:
        """The line measured nearest to `concurrency` (log scale); the lowest when unknown."""
        if concurrency is None or concurrency <= 0:
            return self.lines[0]
        return min(self.lines, key=lambda ln: abs(math.log(ln[0]) - math.log(concurrency)))


# H100, 27B-class hybrid, acceptance 0.8 a position: the fits at 1, 4 and 16 requests (rms
# residual 4.2, 6.5 and 3.0 %). The fit at 64 is left out: there K >= 3 runs past the KV
# capacity and requests wait, which no line in K describes (capacity.py handles it).
PRIORS: tuple[CostPrior, ...] = (
    CostPrior("H100", "H100 80GB HBM3, 27B-class hybrid, bench/results/gpu/realsize.md",
              ((1.0, 25.072, 3.713), (4.0, 7.496, 1.505), (16.0, 1.978, 0.522))),
)


def prior_for(product: str, hybrid: bool = True) -> CostPrior | None:
    """The measured shape for a product's family; measured on a hybrid model only, so a
    dense model's pool gets none (its drafting costs differ)."""
    if not hybrid:
        return None
    family = product_family(product)
    return next((p for p in PRIORS if p.family == family), None)


def prior_fit(prior: CostPrior, measurements: Sequence[Measurement]) -> CostFit | None:
    """The prior's line at the pool's concurrency, scaled to the pool's own step cost at the
    K >= 1 it has the most request-steps at; None without such windows."""
    deep = [m for m in measurements if m.k >= 1]
    if not deep:
        return None
    k = max({m.k for m in deep}, key=lambda x: sum(m.request_steps for m in deep if m.k == x))
    own = pooled([m for m in deep if m.k == k])
    c, base_ms, per_ms = prior.line_at(own.concurrency)
    shape = (base_ms + per_ms * k) / 1e3
    if shape <= 0:
        return None
    scale = own.step_seconds / shape
    return CostFit(
        alpha=base_ms / 1e3 * scale, beta=per_ms / 1e3 * scale, alpha_se=None, beta_se=None,
        cov=None, points=len([m for m in deep if m.k == k]), ks=(k,), rmse=0.0,
        prior=f"shape measured on {prior.family} at concurrency {c:g} ({prior.source})",
    )
