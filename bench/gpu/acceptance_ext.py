"""Controlled MTP acceptance inside a running `vllm serve`: a vLLM worker extension.

Real-size runs use dummy weights (`--load-format dummy`), so the draft never agrees with the
target and a sweep would measure only the cost of K. This extension rewrites a few weights in
place, after the load, so that the target and the MTP drafter agree on a chosen share of
positions. The serving path stays the pool's own (`mtp-runtime serve` -> `vllm serve`); the
bench adds two things through the pool's extraArgs/environment:

    --worker-extension-cls acceptance_ext.AcceptanceControl     (this class, on PYTHONPATH)
    VLLM_SERVER_DEV_MODE=1                                      (vLLM's /collective_rpc route)

and then, between load runs, POSTs

    /collective_rpc {"method": "mtp_bench_set_acceptance", "args": ["0.8", "2048", "7"]}

What the rewrite does (every write is in place, so captured CUDA graphs see it):

* Target: every block's output projection (`o_proj`, `out_proj`, `down_proj`) is zeroed, so the
  residual stream is the token embedding; embedding row i (i < N) is the unit vector e_i; the
  final norm is the identity (weight 1 for a plain RMSNorm, 0 for the `1 + w` Gemma-style norm);
  `lm_head` is the shift W[(i+1) mod N, i] = 1. The target then continues any run of ids < N
  with i -> i+1, on every token, at the full cost of every layer.
* Drafter (one MTP layer, rerun for K > 1): its block's output projections are zeroed and its
  norms made identity, and its 2H -> H input projection maps the token half of its input to
  e_pi(j), where pi is the identity except on a seeded random set S of round((1 - p) * N) ids,
  which it moves by N/2. The drafter then proposes pi(j) + 1 after token j: right exactly when
  j is not in S. Given the previous draft token was accepted, each position is accepted with
  probability ~p, so vLLM's per-position counters read about p, p^2, p^3, ...

The realised rates are read from vLLM's own counters by the bench, never taken from p.
"""

from __future__ import annotations

import random
from typing import Any

# where the token half of the drafter's [H, 2H] input projection starts, by drafter class:
# MiMo concatenates (hidden, token); Qwen3.5 / Qwen3-Next / DeepSeek MTP (token, hidden)
TOKEN_HALF_AT_HIDDEN = ("MiMoMTP",)
ZEROED = ("o_proj", "out_proj", "down_proj")


def _unwrap(model: Any) -> Any:
    while hasattr(model, "unwrap") and not hasattr(model, "named_parameters"):
        model = model.unwrap()
    inner = getattr(model, "runnable", None)
    return inner if inner is not None and hasattr(inner, "named_parameters") else model


def _is_gemma_norm(module: Any) -> bool:
    return any("Gemma" in cls.__name__ for cls in type(module).__mro__)


def _identity_norm(module: Any) -> None:
    module.weight.data.fill_(0.0 if _is_gemma_norm(module) else 1.0)


def _zero_outputs(model: Any) -> int:
    n = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ZEROED and hasattr(module, "weight"):
            module.weight.data.zero_()
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
            n += 1
    return n


def _norms(model: Any, names: tuple[str, ...]) -> list[str]:
    done = []
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in names and hasattr(module, "weight"):
            _identity_norm(module)
            done.append(name)
    return done


def moved_set(n: int, p: float, seed: int) -> set[int]:
    """The ids on which the draft is wrong: round((1 - p) * n) of 0..n-1, seeded."""
    count = round((1.0 - p) * n)
    return set(random.Random(seed).sample(range(n), count))


class AcceptanceControl:
    """Mixed into vLLM's GPU worker by `--worker-extension-cls`; names carry a prefix so they
    cannot clash with the worker's own."""

    def mtp_bench_set_acceptance(self, p: str, n: str = "2048", seed: str = "7") -> dict:
        import torch

        share, vocab_n, rng_seed = float(p), int(n), int(seed)
        runner = self.model_runner  # type: ignore[attr-defined]
        target = _unwrap(runner.get_model())
        drafter_holder = getattr(runner, "drafter", None)
        drafter = _unwrap(drafter_holder.model) if drafter_holder is not None else None
        report: dict = {"p": share, "n": vocab_n, "seed": rng_seed,
                        "target": type(target).__name__,
                        "drafter": type(drafter).__name__ if drafter is not None else None}
        with torch.no_grad():
            report["target_zeroed"] = _zero_outputs(target)
            embed = lm_head = final_norm = None
            for name, module in target.named_modules():
                last = name.rsplit(".", 1)[-1]
                if "visual" in name:
                    continue
                if last == "embed_tokens" and embed is None:
                    embed = module
                elif last == "lm_head":
                    lm_head = module
                elif last == "norm" and name.count(".") <= 2 and "layers" not in name:
                    final_norm = module
            if embed is None or lm_head is None or final_norm is None:
                raise RuntimeError(f"target layout not recognised: embed {embed is not None}, "
                                   f"lm_head {lm_head is not None}, norm {final_norm is not None}")
            hidden = embed.weight.shape[1]
            if vocab_n > hidden or vocab_n > embed.weight.shape[0]:
                raise ValueError(f"N={vocab_n} must fit the hidden size {hidden} and vocabulary")
            idx = torch.arange(vocab_n, device=embed.weight.device)
            embed.weight.data.zero_()
            embed.weight.data[idx, idx] = 1.0
            lm_head.weight.data.zero_()
            lm_head.weight.data[(idx + 1) % vocab_n, idx] = 1.0
            _identity_norm(final_norm)
            report["target_final_norm"] = type(final_norm).__name__
            if drafter is not None:
                report["drafter_zeroed"] = _zero_outputs(drafter)
                report["drafter_norms"] = _norms(drafter, (
                    "token_layernorm", "hidden_layernorm", "final_layernorm",
                    "pre_fc_norm_hidden", "pre_fc_norm_embedding", "enorm", "hnorm", "norm"))
                proj = None
                for name, param in drafter.named_parameters():
                    if param.dim() == 2 and param.shape[0] == hidden and \
                            param.shape[1] == 2 * hidden:
                        proj = (name, param)
                if proj is None:
                    raise RuntimeError("drafter has no [H, 2H] input projection")
                at = hidden if type(drafter).__name__ in TOKEN_HALF_AT_HIDDEN else 0
                moved = moved_set(vocab_n, share, rng_seed)
                perm = [((j + vocab_n // 2) % vocab_n if j in moved else j)
                        for j in range(vocab_n)]
                rows = torch.tensor(perm, device=proj[1].device)
                proj[1].data.zero_()
                proj[1].data[rows, idx + at] = 1.0
                report["drafter_projection"] = proj[0]
                report["token_half_at"] = at
                report["moved_ids"] = len(moved)
                # a drafter that keeps its own embedding/lm_head copies gets the same rewrite
                for name, module in drafter.named_modules():
                    last = name.rsplit(".", 1)[-1]
                    if last == "embed_tokens" and module.weight.data_ptr() != \
                            embed.weight.data_ptr():
                        module.weight.data.copy_(embed.weight.data)
                        report["drafter_own_embedding"] = True
                    if last == "lm_head" and module.weight.data_ptr() != \
                            lm_head.weight.data_ptr():
                        module.weight.data.copy_(lm_head.weight.data)
                        report["drafter_own_lm_head"] = True
        torch.cuda.synchronize()
        return report
