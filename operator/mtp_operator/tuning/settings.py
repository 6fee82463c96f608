"""A resource's `spec.speculative.tuning` as the decision's Policy, and its checks. Pure."""

from __future__ import annotations

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.builders import STARTUP_BUDGET_S
from mtp_runtime.gpu_profiles import DEFAULT_PROFILES, valid_k_for_depth
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS

from .decision import Policy

# Without maxSpeculativeTokens the candidates go up to the profile table's deepest K.
DEFAULT_CAP = max(p.k for p in DEFAULT_PROFILES)


def default_candidates(spec: MTPInferenceSpec) -> tuple[int, ...]:
    s = spec.speculative
    cap = s.max_speculative_tokens if s.max_speculative_tokens is not None else DEFAULT_CAP
    cap = min(cap, MAX_SPECULATIVE_TOKENS)
    return tuple(k for k in range(cap + 1) if valid_k_for_depth(k, s.mtp_layers))


def policy_for(spec: MTPInferenceSpec) -> Policy:
    t = spec.speculative.tuning
    # never past the K the operator runs (the schema says so too; a spec built in code may not)
    cands = (
        tuple(k for k in sorted(set(t.candidates)) if 0 <= k <= MAX_SPECULATIVE_TOKENS)
        if t.candidates is not None else None
    )
    return Policy(
        mode=t.mode,
        candidates=cands if cands is not None else default_candidates(spec),
        min_gain=t.min_gain,
        observation_seconds=float(t.observation_seconds),
        max_trials_per_day=t.max_trials_per_day,
        revisit_seconds=float(t.revisit_seconds),
        trial_windows=t.trial_windows,
        startup_seconds=float(STARTUP_BUDGET_S),
    )


def tuning_problems(spec: MTPInferenceSpec) -> list[tuple[str, str]]:
    """What the schema cannot see: candidates vLLM would refuse, or none left to try."""
    s = spec.speculative
    t = s.tuning
    found: list[tuple[str, str]] = []
    if t.candidates is not None:
        for k in sorted(set(t.candidates)):
            if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
                found.append((
                    "speculative.tuning.candidates",
                    f"{k} exceeds {MAX_SPECULATIVE_TOKENS}, the most speculative tokens the "
                    "operator runs" if k > 0 else f"{k}: must be 0 (off) or more",
                ))
            elif s.max_speculative_tokens is not None and k > s.max_speculative_tokens:
                found.append((
                    "speculative.tuning.candidates",
                    f"{k} exceeds speculative.maxSpeculativeTokens {s.max_speculative_tokens}",
                ))
            elif not valid_k_for_depth(k, s.mtp_layers):
                found.append((
                    "speculative.tuning.candidates",
                    f"{k}: vLLM needs K above mtpLayers {s.mtp_layers} to be a multiple of it",
                ))
        if t.mode != "Off" and not t.candidates:
            found.append(("speculative.tuning.candidates", "must list at least one K to tune"))
    if t.mode != "Off" and s.batch_size_schedule:
        found.append((
            "speculative.tuning.mode",
            "cannot tune a pool that runs a batchSizeSchedule: its K changes with every "
            "engine step, so a window measures no single K (remove one of the two)",
        ))
    return found
