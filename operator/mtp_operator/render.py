"""Offline rendering: the objects the operator would create for a resource (like `helm template`).

No cluster is read, so the GPU products come from `--gpu-product`, else from the resource's
`gpuProducts`, else the cards the built-in K table was set from (the field report's A100,
H100 and L40S: `mtp_runtime.gpu_profiles.FIELD_REPORT_PRODUCTS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from mtp_operator import builders, model_cache
from mtp_operator.planning import PlanError, plan_pool
from mtp_operator.settings import OperatorSettings
from mtp_operator.traffic_classes import class_plans
from mtp_operator.validation import spec_problems
from mtp_runtime.gpu_profiles import FIELD_REPORT_PRODUCTS
from mtp_runtime.problems import problems_text

DEFAULT_PRODUCTS = FIELD_REPORT_PRODUCTS
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


class RenderError(ValueError):
    pass


def render_resource(
    doc: dict[str, Any],
    products: Sequence[str] | None = None,
    settings: OperatorSettings | None = None,
) -> list[dict[str, Any]]:
    settings = settings or OperatorSettings()
    if doc.get("kind") != "MTPInference":
        raise RenderError(f"kind: expected MTPInference, got {doc.get('kind')!r}")
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise RenderError("metadata.name: required")
    spec, problems = spec_problems(doc.get("spec") or {})
    if spec is not None and not problems:  # no cluster here: claims are not looked up
        problems = model_cache.cache_problems(spec, settings.model_cache)
    if problems or spec is None:
        raise RenderError(problems_text(problems, _spec_field))
    chosen = list(products or spec.gpu_products or DEFAULT_PRODUCTS)
    try:
        plans = [plan_pool(spec, p, settings.gpu_profiles) for p in chosen]
        if spec.speculative.classes:  # a pool per (product, class), as the operator plans
            plans, _ = class_plans(spec, plans, settings.gpu_profiles, lambda _: None, {})
    except PlanError as err:
        raise RenderError(problems_text(err.problems, _spec_field)) from err
    return builders.desired_objects(
        name,
        meta.get("namespace", "default"),
        meta.get("uid", PLACEHOLDER_UID),
        spec,
        plans,
        settings.default_image,
        settings.gpu_profiles,
        model_cache.effective(spec, settings.model_cache, meta.get("namespace", "default")),
    )


def _spec_field(field: str) -> str:
    return field if field == "spec" else f"spec.{field}"


def render_documents(
    text: str, products: Sequence[str] | None = None, settings: OperatorSettings | None = None
) -> str:
    objs: list[dict[str, Any]] = []
    try:
        docs = list(_docs(yaml.safe_load_all(text)))
    except yaml.YAMLError as err:
        raise RenderError(f"not valid YAML: {err}") from err
    if not docs:
        raise RenderError("no MTPInference in the file (it is empty)")
    for doc in docs:
        objs += render_resource(doc, products, settings)
    return yaml.safe_dump_all(objs, sort_keys=False, width=120)


def _docs(items: Iterable[Any]) -> Iterable[dict[str, Any]]:
    for n, item in enumerate(items, 1):
        if item is None:
            continue  # an empty document between `---` lines
        if isinstance(item, dict) and item.get("kind") == "List":
            for sub in item.get("items") or []:
                if not isinstance(sub, dict):
                    raise RenderError(f"document {n}: List items must be objects")
                yield sub
        elif isinstance(item, dict):
            yield item
        else:
            what = "a list" if isinstance(item, list) else f"a {type(item).__name__}"
            raise RenderError(f"document {n} is {what}, not an MTPInference object")
