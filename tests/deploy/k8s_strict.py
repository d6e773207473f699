"""Strict reading of Kubernetes manifests into the official Python client's
typed models (Debian's python3-kubernetes), for tests/deploy/test_k8s_manifests.py.

The client's ApiClient.deserialize builds the typed objects (V1Deployment,
...) and enforces required fields, but silently drops a field it does not
know and keeps a value of the wrong type. So every document is first walked
against the models' own schemas (openapi_types, attribute_map): an unknown
field or a mistyped value is an error naming its path. Not a test module.

Debian 12 packages client 22.6 (the Kubernetes 1.22 API). Two things the
manifests use are newer, and are checked against the schemas below instead:
  * Probe.grpc (Kubernetes 1.24 beta, 1.27 GA): {port: int (required), service: str};
  * autoscaling/v2 HorizontalPodAutoscaler (1.23 GA): read with the
    autoscaling/v2beta2 models, whose fields v2 kept unchanged.
Quantities (cpu, memory) are strings in the client's schema: write them quoted.
"""

import json
import re

import kubernetes.client as k8s

# (apiVersion, kind) -> the client's model.
MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "Service"): "V1Service",
    ("v1", "Secret"): "V1Secret",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2beta2HorizontalPodAutoscaler",
}

# Fields newer than the client: model -> {json key: type}.
EXTRA_FIELDS = {"V1Probe": {"grpc": "GRPCAction"}}
EXTRA_MODELS = {"GRPCAction": ({"port": "int", "service": "str"}, {"port"})}

_PRIMITIVES = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


class ManifestError(ValueError):
    pass


def _check(value, type_name, path, errors):
    m = re.fullmatch(r"list\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list ({type_name}), got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            _check(v, m.group(1), f"{path}[{i}]", errors)
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if m:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map ({type_name}), got {type(value).__name__}")
            return
        for k, v in value.items():
            _check(v, m.group(1), f"{path}.{k}", errors)
        return
    if type_name == "object":  # IntOrString and free-form values
        return
    if type_name in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[type_name]) and not (type_name in ("int", "float") and isinstance(value, bool))
        if not ok:
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    _check_model(value, type_name, path, errors)


def _check_model(value, model, path, errors):
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({model}), got {type(value).__name__} {value!r}")
        return
    if model in EXTRA_MODELS:
        fields, required = EXTRA_MODELS[model]
    else:
        cls = getattr(k8s, model)
        fields = {cls.attribute_map[a]: t for a, t in cls.openapi_types.items()}
        required = set()
    fields = {**fields, **EXTRA_FIELDS.get(model, {})}
    for key in sorted(required - value.keys()):
        errors.append(f"{path}: missing required field '{key}' ({model})")
    for key, v in value.items():
        if key not in fields:
            errors.append(f"{path}: unknown field '{key}' ({model})")
            continue
        _check(v, fields[key], f"{path}.{key}", errors)


class _Response:  # what ApiClient.deserialize reads: the JSON text in .data
    def __init__(self, doc):
        self.data = json.dumps(doc)


def load(doc, where="document"):
    """The typed model of one manifest; ManifestError naming every bad field."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: not a mapping")
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in MODELS:
        raise ManifestError(f"{where}: no model for apiVersion {key[0]!r} kind {key[1]!r}")
    name = (doc.get("metadata") or {}).get("name", "?")
    errors = []
    _check_model(doc, MODELS[key], f"{key[1]}/{name}", errors)
    if errors:
        raise ManifestError(f"{where}: " + "; ".join(errors))
    client = k8s.ApiClient()
    try:
        return client.deserialize(_Response(doc), MODELS[key])
    except (ValueError, TypeError) as e:
        raise ManifestError(f"{where}: {key[1]}/{name}: {e}") from e
