"""Sedna's Go types and Go's ``encoding/json``, as far as the GM's messages show them.

The GM never forwards JSON it was given: it decodes into its Go structs and marshals them
again. So a key its types do not declare is dropped (``deploySpec.trigger`` of a
LifelongLearningJob), a declared one comes back in the struct's order with Go's
``omitempty`` rules (an absent ``classes`` of a Model comes back as ``null``), map keys come
back sorted, numbers as Go writes them (``1`` for a float64 1.0, a float32 at its shortest),
strings with ``<``, ``>`` and ``&`` escaped; a value of the wrong JSON type makes the whole
decode fail, as ``json.Unmarshal`` returns an error.

A Go value is held as plain Python: a struct as a dict holding every field (zero values
included), a nil pointer, slice or map as None, a ``metav1.Time`` as its RFC 3339 text or
None when zero. `decode` and `encode` take the Go type as a `GoType`: the struct types
below are written field by field from Sedna's ``pkg/apis/sedna/v1alpha1`` (the
lifelong- and incremental-learning jobs, Dataset, Model), ``pkg/globalmanager/runtime``
(the Model of condition data) and the lifelong-learning controller's ConditionData, whose
fields the incremental-learning controller's IncrementalCondData declares alike.
A pod template's ``spec`` is kept as given (`OPAQUE`): the Kubernetes API server has checked
it against PodSpec already, so pruning it would change nothing the controller reads.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


class GoDecodeError(ValueError):
    """What ``json.Unmarshal`` returns: a value of the wrong type for its field."""


@dataclass(frozen=True)
class GoType:
    """One Go type: ``kind`` is string, int, float64, float32, bool, time, any, opaque,
    struct, ptr, slice or map; ``elem`` the element type of ptr/slice/map; ``fields`` a
    struct's fields in declaration order."""

    kind: str
    elem: GoType | None = None
    fields: tuple[Field, ...] = ()


@dataclass(frozen=True)
class Field:
    """A struct field: its JSON name, type, and whether it is ``omitempty``."""

    name: str
    type: GoType
    omitempty: bool = False


STRING = GoType("string")
INT = GoType("int")
FLOAT64 = GoType("float64")
FLOAT32 = GoType("float32")
BOOL = GoType("bool")
TIME = GoType("time")  # metav1.Time: RFC 3339 text, null when zero
ANY = GoType("any")  # interface{}: objects become map[string]interface{}, numbers float64
OPAQUE = GoType("opaque")  # kept verbatim


def struct_(*fields: Field) -> GoType:
    return GoType("struct", fields=fields)


def ptr(elem: GoType) -> GoType:
    return GoType("ptr", elem=elem)


def slice_(elem: GoType) -> GoType:
    return GoType("slice", elem=elem)


def map_(elem: GoType) -> GoType:
    return GoType("map", elem=elem)


def f(name: str, type_: GoType, omitempty: bool = False) -> Field:
    return Field(name, type_, omitempty)


OWNER_REFERENCE = struct_(
    f("apiVersion", STRING), f("kind", STRING), f("name", STRING), f("uid", STRING),
    f("controller", ptr(BOOL), True), f("blockOwnerDeletion", ptr(BOOL), True),
)  # fmt: skip
OBJECT_META = struct_(
    f("name", STRING, True), f("generateName", STRING, True), f("namespace", STRING, True),
    f("selfLink", STRING, True), f("uid", STRING, True), f("resourceVersion", STRING, True),
    f("generation", INT, True), f("creationTimestamp", TIME, True),
    f("deletionTimestamp", ptr(TIME), True), f("deletionGracePeriodSeconds", ptr(INT), True),
    f("labels", map_(STRING), True), f("annotations", map_(STRING), True),
    f("ownerReferences", slice_(OWNER_REFERENCE), True), f("finalizers", slice_(STRING), True),
    f("managedFields", slice_(ANY), True),
)  # fmt: skip
POD_TEMPLATE_SPEC = struct_(f("metadata", OBJECT_META, True), f("spec", OPAQUE, True))

TRIGGER = struct_(
    f("checkPeriodSeconds", INT, True),
    f("timer", ptr(struct_(f("start", STRING), f("end", STRING))), True),
    f("condition", struct_(f("operator", STRING), f("threshold", FLOAT64), f("metric", STRING))),
)
NAME_REF = struct_(f("name", STRING))  # InitialModel, InitialEvalModel
KEY_VALUE = struct_(f("key", STRING), f("value", STRING))  # ParaSpec, Metric
JOB_DATASET = struct_(f("name", STRING), f("trainProb", FLOAT64))
TRAIN_SPEC = struct_(f("template", POD_TEMPLATE_SPEC), f("trigger", TRIGGER))
LL_JOB_SPEC = struct_(
    f("dataset", JOB_DATASET),
    f("trainSpec", TRAIN_SPEC),
    f("evalSpec", struct_(f("template", POD_TEMPLATE_SPEC))),
    f("deploySpec", struct_(f("template", POD_TEMPLATE_SPEC))),
    f("credentialName", STRING, True),
    f("outputDir", STRING),
)
IL_JOB_SPEC = struct_(
    f("dataset", JOB_DATASET),
    f("initialModel", NAME_REF),
    f("trainSpec", TRAIN_SPEC),
    f("evalSpec", struct_(
        f("initialEvalModel", ptr(NAME_REF), True), f("template", POD_TEMPLATE_SPEC),
    )),
    f("deploySpec", struct_(
        f("model", struct_(
            f("name", STRING), f("hotUpdateEnabled", BOOL, True),
            f("pollPeriodSeconds", INT, True),
        )),
        f("trigger", TRIGGER),
        f("hardExampleMining", struct_(
            f("name", STRING),
            f("parameters", slice_(KEY_VALUE), True),
        )),
        f("template", POD_TEMPLATE_SPEC),
    )),
    f("credentialName", STRING, True),
    f("outputDir", STRING),
)  # fmt: skip
# LLJobCondition and ILJobCondition declare the same fields
JOB_CONDITION = struct_(
    f("type", STRING), f("status", STRING), f("stage", STRING),
    f("lastHeartbeatTime", TIME, True), f("lastTransitionTime", TIME, True),
    f("reason", STRING, True), f("message", STRING, True), f("data", STRING, True),
)  # fmt: skip
KNOWLEDGE_BASE = struct_(
    f("AIModels", struct_(
        f("numberOfAIModels", INT),
        f("listOfAIModels", slice_(struct_(
            f("modelID", STRING), f("averagePrecision", FLOAT32),
            f("numberOfTrainSamples", INT),
        )), True),
    )),
    f("AIClasses", struct_(
        f("numberOfAIClasses", INT), f("listOfAIClasses", slice_(STRING), True),
    )),
    f("samples", struct_(
        f("numberOfLabeledUnseenSample", INT), f("numberOfUnseenSample", INT),
    )),
)  # fmt: skip
START_COMPLETION = (f("startTime", ptr(TIME), True), f("completionTime", ptr(TIME), True))
LL_JOB_STATUS = struct_(
    f("conditions", slice_(JOB_CONDITION), True),
    f("knowledgeBase", KNOWLEDGE_BASE, True),
    *START_COMPLETION,
)
IL_JOB_STATUS = struct_(f("conditions", slice_(JOB_CONDITION), True), *START_COMPLETION)
TYPE_META = (f("kind", STRING, True), f("apiVersion", STRING, True))
LIFELONG_LEARNING_JOB = struct_(
    *TYPE_META, f("metadata", OBJECT_META), f("spec", LL_JOB_SPEC),
    f("status", LL_JOB_STATUS, True),
)  # fmt: skip
INCREMENTAL_LEARNING_JOB = struct_(
    *TYPE_META, f("metadata", OBJECT_META), f("spec", IL_JOB_SPEC),
    f("status", IL_JOB_STATUS, True),
)  # fmt: skip
DATASET_STATUS = struct_(f("updateTime", ptr(TIME), True), f("numberOfSamples", INT))
DATASET = struct_(
    *TYPE_META, f("metadata", OBJECT_META, True),
    f("spec", struct_(
        f("url", STRING), f("format", STRING), f("nodeName", STRING),
        f("credentialName", STRING, True),
    )),
    f("status", DATASET_STATUS, True),
)  # fmt: skip
MODEL = struct_(
    f("format", STRING), f("url", STRING), f("device_soc_versions", slice_(STRING), True),
    f("metrics", map_(ANY), True), f("history_metric", FLOAT32, True),
    f("current_metric", map_(map_(FLOAT32)), True), f("classes", slice_(STRING)),
    f("number_of_labeled_unseen_sample", INT, True), f("number_of_model", INT, True),
    f("number_of_unseen_sample", INT, True),
)  # fmt: skip
CONDITION_DATA = struct_(
    f("input", ptr(struct_(
        f("model", ptr(MODEL), True), f("models", slice_(MODEL), True),
        f("dataURL", STRING, True), f("dataIndexURL", STRING, True),
        f("outputDir", STRING, True),
    )), True),
    f("output", ptr(struct_(f("model", ptr(MODEL), True), f("models", slice_(MODEL), True))),
      True),
)  # fmt: skip
# sednav1.Model, the Model resource (`MODEL` is runtime.Model, a model in condition data)
MODEL_RESOURCE = struct_(
    *TYPE_META, f("metadata", OBJECT_META, True),
    f("spec", struct_(
        f("url", STRING), f("format", STRING), f("device_soc_versions", slice_(STRING), True),
        f("credentialName", STRING, True),
    )),
    f("status", struct_(
        f("updateTime", ptr(TIME), True),
        f("metrics", slice_(KEY_VALUE), True),
    ), True),
)  # fmt: skip
# What updateFromEdge first reads of a job status: its phase and status.
JOB_STATUS_HEAD = struct_(f("phase", STRING), f("status", STRING))


# -- decoding (json.Unmarshal) --------------------------------------------------------------


def zero(t: GoType) -> Any:
    """Go's zero value of ``t``."""
    if t.kind == "struct":
        return {field.name: zero(field.type) for field in t.fields}
    return {"string": "", "int": 0, "float64": 0.0, "float32": 0.0, "bool": False}.get(t.kind)


def decode(t: GoType, value: Any, where: str = "") -> Any:
    """``value`` (parsed JSON) unmarshalled into a Go value of type ``t``."""
    if value is None:
        return zero(t)  # null leaves the Go value at its zero
    kind = t.kind
    if kind in ("any", "opaque"):
        return value
    if kind == "string":
        return _checked(value, str, where, "string")
    if kind == "time":
        return _checked(value, str, where, "Time")
    if kind == "bool":
        return _checked(value, bool, where, "bool")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise GoDecodeError(f"json: cannot unmarshal {_json_kind(value)} into {where} int")
        return value
    if kind in ("float64", "float32"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GoDecodeError(f"json: cannot unmarshal {_json_kind(value)} into {where} {kind}")
        return _float32(float(value)) if kind == "float32" else float(value)
    assert t.elem is not None or kind == "struct"
    if kind == "ptr":
        assert t.elem is not None
        return decode(t.elem, value, where)
    if kind == "slice":
        assert t.elem is not None
        items = _checked(value, list, where, "slice")
        return [decode(t.elem, item, f"{where}[]") for item in items]
    if kind == "map":
        assert t.elem is not None
        obj = _checked(value, dict, where, "map")
        return {key: decode(t.elem, item, f"{where}.{key}") for key, item in obj.items()}
    obj = _checked(value, dict, where, "struct")
    out = zero(t)
    for field in t.fields:
        present, item = _lookup(obj, field.name)
        if present:
            out[field.name] = decode(field.type, item, f"{where}.{field.name}".lstrip("."))
    return out


def _checked(value: Any, types: type, where: str, go: str) -> Any:
    if isinstance(value, types) and not (types is not bool and isinstance(value, bool)):
        return value
    raise GoDecodeError(f"json: cannot unmarshal {_json_kind(value)} into {where or 'value'} {go}")


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _lookup(obj: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """A struct field's value: the exact key, else one equal ignoring case (Go's rule)."""
    if name in obj:
        return True, obj[name]
    for key, value in obj.items():
        if key.lower() == name.lower():
            return True, value
    return False, None


def _float32(x: float) -> float:
    """``x`` rounded to the nearest float32, as a Python float."""
    if math.isinf(x) or abs(x) > 3.4028234663852886e38:
        raise GoDecodeError(f"json: cannot unmarshal number {x} into float32")
    return float(struct.unpack("f", struct.pack("f", x))[0])


# -- encoding (json.Marshal) ----------------------------------------------------------------


def encode(t: GoType, value: Any) -> Any:
    """The Go value ``value`` of type ``t`` as the JSON ``json.Marshal`` writes (parsed form,
    with floats as `GoFloat`; `dumps` writes it as Go's bytes)."""
    kind = t.kind
    if kind == "opaque":
        return value
    if kind == "any":
        return _encode_any(value)
    if kind in ("float64", "float32"):
        return GoFloat(value, 32 if kind == "float32" else 64)
    if kind in ("string", "int", "bool", "time"):
        return value
    if value is None:
        return None
    assert t.elem is not None or kind == "struct"
    if kind == "ptr":
        assert t.elem is not None
        return encode(t.elem, value)
    if kind == "slice":
        assert t.elem is not None
        return [encode(t.elem, item) for item in value]
    if kind == "map":
        assert t.elem is not None
        return {key: encode(t.elem, value[key]) for key in sorted(value)}
    out: dict[str, Any] = {}
    for field in t.fields:
        item = value.get(field.name, zero(field.type))
        if field.omitempty and _empty(field.type, item):
            continue
        out[field.name] = encode(field.type, item)
    return out


def _empty(t: GoType, value: Any) -> bool:
    """Go's isEmptyValue: false, 0, "", nil, empty slice or map; never a struct."""
    if t.kind in ("struct", "time"):
        return False  # metav1.Time is a struct: never omitted, null when zero
    if t.kind in ("any", "opaque"):
        return value is None
    return value is None or value in ("", 0, False) or value in ([], {})


def _encode_any(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _encode_any(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_encode_any(item) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return GoFloat(float(value), 64)  # interface{} numbers are float64
    return value


@dataclass(frozen=True)
class GoFloat:
    """A float as Go writes it: shortest text that reads back to the same float64/float32,
    decimal unless below 1e-6 or from 1e21 on, no ``.0`` on integral values."""

    value: float
    bits: int

    def text(self) -> str:
        x = self.value
        if x == 0:
            return "-0" if math.copysign(1, x) < 0 else "0"
        digits = Decimal(_shortest32(x) if self.bits == 32 else repr(x)).normalize()
        if abs(x) < 1e-6 or abs(x) >= 1e21:
            return format(digits, "e").replace("E", "e")
        return format(digits, "f")


def _shortest32(x: float) -> str:
    target = _float32(x)
    for precision in range(1, 10):
        text = f"{target:.{precision}g}"
        if _float32(float(text)) == target:
            return text
    return repr(target)


_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def dumps(value: Any) -> bytes:
    """``value`` (from `encode`) as the bytes Go's ``json.Marshal`` writes."""
    return _write(value).encode()


def _write(value: Any) -> str:
    if isinstance(value, GoFloat):
        return value.text()
    if isinstance(value, dict):
        return "{" + ",".join(f"{_string(k)}:{_write(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_write(item) for item in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, float):
        return GoFloat(value, 64).text()
    return json.dumps(value)  # int, bool, None


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).translate(_GO_ESCAPES)


def remarshal(t: GoType, value: Any) -> bytes:
    """JSON (parsed) through a Go type and back: what the GM keeps of it, as bytes."""
    return dumps(encode(t, decode(t, value)))
