"""Generates the MTPInference CustomResourceDefinition from the pydantic models.

`crds/` holds this function's output; tests/unit/api/test_crd.py fails when they drift apart.
Regenerate with `mtp-operator crd > crds/mtp-operator.io_mtpinferences.yaml` (`make crds`).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from mtp_operator.api import classes as classes_api
from mtp_operator.api import v1alpha1 as api
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS, RESERVED_FLAGS, reserved_pattern


def _cel_string(text: str) -> str:
    """`text` as the inside of a single-quoted CEL string literal."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


# int | "auto" and int | "32k": Kubernetes' int-or-string, with CEL for the string half.
_INT_OR_STRING_RULES = {
    "numSpeculativeTokens": [
        {
            "rule": "type(self) == string ? self == 'auto' : "
            f"self >= 0 && self <= {MAX_SPECULATIVE_TOKENS}",
            "message": f"must be `auto` or an integer 0-{MAX_SPECULATIVE_TOKENS} (0 turns "
            "speculation off)",
        }
    ],
    "maxModelLen": [
        {
            "rule": "type(self) == string ? self.matches('^(auto|-1|[0-9]+[kKmMgG]?)$') : "
            "(self > 0 && self <= 2147483647) || self == -1",
            "message": "must be a positive integer, `auto`, or a size such as `32k`",
        }
    ],
}

_SPEC_RULES: dict[str, list[dict[str, str]]] = {
    "alertMatchers": [
        {
            "rule": f"self.all(k, k.matches('{_cel_string(api.LABEL_NAME_PATTERN)}'))",
            "message": "every key must be a Prometheus label name "
            f"({api.LABEL_NAME_PATTERN})",
        }
    ],
    "profiles": [
        {
            "rule": f"self.all(k, self[k] >= 0 && self[k] <= {MAX_SPECULATIVE_TOKENS})",
            "message": f"every profile K must be an integer 0-{MAX_SPECULATIVE_TOKENS}",
        }
    ],
    "extraArgs": [
        {
            # generated from the runtime's own list and matcher, so the API server refuses
            # exactly what the operator refuses (tests/unit/api/test_crd.py checks they agree)
            "rule": f"self.all(a, !a.matches('{_cel_string(reserved_pattern())}'))",
            "message": "must not set flags the operator derives from the spec, that would "
            "break the pool or that read flags from a file, in any spelling (underscores, "
            "abbreviations, =value, dotted keys, several flags in one entry): "
            + ", ".join(sorted(RESERVED_FLAGS))
            + "; use the spec fields instead",
        }
    ],
}


def _pod_part_schemas() -> dict[str, dict[str, Any]]:
    """Structural schemas (and CEL) for the Kubernetes parts a spec passes to the pods, so the
    API server refuses what would make an invalid pool Deployment (pod_parts.py says the same
    for what reaches the operator anyway)."""
    reserved_env = ", ".join(f"'{n}'" for n in api.RESERVED_ENV)
    # Kubernetes' own schema for a resource.Quantity (as controller-gen writes it)
    quantity = {"x-kubernetes-int-or-string": True, "pattern": api.QUANTITY_PATTERN}
    return {
        "env": {
            "type": "array",
            "maxItems": api.MAX_ENV,
            "x-kubernetes-list-type": "map",  # names are unique
            "x-kubernetes-list-map-keys": ["name"],
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 253,
                        "pattern": api.ENV_NAME,
                    },
                    "value": {"type": "string"},
                    "valueFrom": {
                        "type": "object",
                        "maxProperties": 1,
                        "minProperties": 1,
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                },
                "x-kubernetes-validations": [
                    {
                        "rule": f"!(self.name in [{reserved_env}])",
                        "message": f"{', '.join(api.RESERVED_ENV)} are set by the operator",
                        "fieldPath": ".name",
                    },
                    {
                        "rule": "!has(self.value) || !has(self.valueFrom)",
                        "message": "value and valueFrom are exclusive",
                    },
                ],
            },
        },
        "resources": {
            "type": "object",
            "properties": {
                "limits": {"type": "object", "maxProperties": 64, "additionalProperties": quantity},
                "requests": {
                    "type": "object",
                    "maxProperties": 64,
                    "additionalProperties": quantity,
                },
                "claims": {
                    "type": "array",
                    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            },
        },
        "tolerations": {
            "type": "array",
            "maxItems": api.MAX_TOLERATIONS,
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string", "maxLength": 317},
                    "operator": {"type": "string", "enum": list(api.TOLERATION_OPERATORS)},
                    "value": {"type": "string", "maxLength": 63},
                    "effect": {"type": "string", "enum": ["", *api.TOLERATION_EFFECTS]},
                    "tolerationSeconds": {"type": "integer", "format": "int64"},
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.operator) || self.operator != 'Exists' || "
                        "!has(self.value) || self.value == ''",
                        "message": "value must be empty when operator is Exists",
                    },
                    {
                        "rule": "(has(self.key) && self.key != '') || "
                        "(has(self.operator) && self.operator == 'Exists')",
                        "message": "key is required unless operator is Exists",
                    },
                    {
                        "rule": "!has(self.tolerationSeconds) || "
                        "(has(self.effect) && self.effect == 'NoExecute')",
                        "message": "tolerationSeconds is only valid with effect NoExecute",
                    },
                ],
            },
        },
    }


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline $refs, collapse Optional[...] and drop what structural schemas forbid."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**copy.deepcopy(target), **{k: v for k, v in schema.items() if k != "$ref"}}
        return _resolve(merged, defs)
    out: dict[str, Any] = {}
    any_of = schema.get("anyOf")
    if any_of is not None:
        options = [o for o in any_of if o.get("type") != "null"]
        types = {o.get("type") for o in options} | {
            "string" for o in options if "const" in o or "enum" in o
        }
        if types >= {"integer", "string"}:
            out["x-kubernetes-int-or-string"] = True
        elif len(options) == 1:
            inner = _resolve(options[0], defs)
            for key in ("description", "default"):
                if schema.get(key) is not None:
                    inner[key] = schema[key]
            return inner
        else:  # pragma: no cover - the models have no other unions
            raise ValueError(f"unsupported union in schema: {any_of}")
    for key in (
        "type",
        "description",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "enum",
        "format",
        "minItems",
        "maxItems",
        "maxProperties",
        "pattern",
    ):
        if key in schema:
            out[key] = schema[key]
    if "exclusiveMinimum" in schema:
        out["minimum"] = schema["exclusiveMinimum"]
    if "const" in schema:
        out["enum"] = [schema["const"]]
        out["type"] = "string"
    if "default" in schema and schema["default"] is not None:
        out["default"] = schema["default"]
    if out.get("type") == "object" or "properties" in schema:
        out["type"] = "object"
        props = schema.get("properties")
        if props:
            out["properties"] = {k: _resolve(v, defs) for k, v in props.items()}
            if schema.get("required"):
                out["required"] = list(schema["required"])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _resolve(extra, defs) if extra else {}
            if not extra:
                out.pop("additionalProperties")
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif not props:
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "array":
        out["items"] = _resolve(schema.get("items", {}), defs)
        if not out["items"]:
            out["items"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return out


def _schema_for(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")  # type: ignore[attr-defined]
    return _resolve(raw, raw.get("$defs", {}))


def _classes_schema(classes: dict[str, Any]) -> None:
    """spec.speculative.classes: names unique (a list-map keyed by name), the list's CEL, and
    each class's K and tuning as the resource's own."""
    classes["x-kubernetes-list-type"] = "map"
    classes["x-kubernetes-list-map-keys"] = ["name"]
    classes["x-kubernetes-validations"] = classes_api.CLASSES_CEL
    item = classes["items"]
    item["x-kubernetes-validations"] = classes_api.CLASS_CEL
    props = item["properties"]
    props["numSpeculativeTokens"]["x-kubernetes-validations"] = _INT_OR_STRING_RULES[
        "numSpeculativeTokens"
    ]
    props["promptTokens"]["x-kubernetes-validations"] = classes_api.PROMPT_TOKENS_CEL
    props["tuning"]["properties"]["candidates"]["x-kubernetes-list-type"] = "set"


def _spec_schema() -> dict[str, Any]:
    spec = _schema_for(api.MTPInferenceSpec)
    props = spec["properties"]
    for nested in ("speculative", "rollback"):
        props[nested]["default"] = {}
    spec_props = props["speculative"]["properties"]
    spec_props["numSpeculativeTokens"]["x-kubernetes-validations"] = _INT_OR_STRING_RULES[
        "numSpeculativeTokens"
    ]
    props["maxModelLen"]["x-kubernetes-validations"] = _INT_OR_STRING_RULES["maxModelLen"]
    spec_props["profiles"]["x-kubernetes-validations"] = _SPEC_RULES["profiles"]
    spec_props["tuning"]["default"] = {}
    spec_props["tuning"]["properties"]["candidates"]["x-kubernetes-list-type"] = "set"
    props["extraArgs"]["x-kubernetes-validations"] = _SPEC_RULES["extraArgs"]
    rollback = props["rollback"]["properties"]
    rollback["alertNames"]["x-kubernetes-list-type"] = "set"
    rollback["alertMatchers"]["x-kubernetes-validations"] = _SPEC_RULES["alertMatchers"]
    _classes_schema(spec_props["classes"])
    props["speculative"]["x-kubernetes-validations"] = classes_api.SPECULATIVE_CEL
    cache = props["modelCache"]
    cache["x-kubernetes-validations"] = api.MODEL_CACHE_CEL
    cache["properties"]["hostPath"]["properties"]["path"]["x-kubernetes-validations"] = (
        api.HOST_PATH_CEL
    )
    # `none: {}` is an empty object (like emptyDir: {}), not a free-form map
    cache["properties"]["none"].pop("x-kubernetes-preserve-unknown-fields", None)
    for name, schema in _pod_part_schemas().items():
        props[name] = {"description": props[name].get("description", ""), **schema}
    spec["x-kubernetes-validations"] = api.SPEC_CEL_RULES
    return spec


def _status_schema() -> dict[str, Any]:
    status = _schema_for(api.MTPInferenceStatus)
    for key in ("conditions", "pools", "rollbacks"):
        status["properties"][key].pop("default", None)
    status["properties"]["rollbacks"]["maxItems"] = api.MAX_ROLLBACK_HISTORY
    return status


PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
    {
        "name": "Pools",
        "type": "string",
        "jsonPath": ".status.poolsSummary",
        "description": "GPU pools with their number of speculative tokens",
    },
    {
        "name": "Recommended",
        "type": "string",
        "jsonPath": ".status.tuningSummary",
        "description": "The K tuning recommends per pool (Pools shows the K running)",
    },
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Fit",
        "type": "string",
        "jsonPath": ".status.fitSummary",
        "priority": 1,
        "description": "Nodes per replica by GPU product (spec.fit): above 1 a LeaderWorkerSet "
        "pool of groups, `no` no pool",
    },
]


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "mtp-operator"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["all", "mtp"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "MTPInference serves a model with vLLM and MTP "
                            "speculative decoding on one pool per GPU product.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": _spec_schema(),
                                "status": _status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = (
        "# Generated from operator/mtp_operator/api/v1alpha1.py by `mtp-operator crd`. "
        "Do not edit.\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
