"""Fields a message carries that its wire type does not know: misspellings, or additions of a
newer sender.

The decoders in `service.wire` ignore unknown fields on purpose (a newer Sedna GM may send
more), so a misspelt optional field (`checkPeriodSecond`) would silently fall back to its
default. This walks a decoded JSON object beside its msgspec type and names every field the
type does not declare, with the declared field it most resembles. Known fields come from the
types themselves (wire spelling, after msgspec's renaming), never from a list kept by hand.
Mappings typed as free-form (`dict[str, Any]`: pod templates, annotations) are not entered.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from service.wire import Dataset, LifelongLearningJob, ModelResource

_HINT_CUTOFF = 0.6
#: The kinds whose spec the controller interprets, by `kind` in lower case (a joint-inference
#: service's or federated-learning job's spec is stored and passed on, like a template).
_RESOURCES: Mapping[str, type[Dataset] | type[LifelongLearningJob] | type[ModelResource]] = {
    "dataset": Dataset,
    "lifelonglearningjob": LifelongLearningJob,
    "model": ModelResource,
}


@dataclass(frozen=True)
class UnknownField:
    """A field its type does not declare: where, and the declared ones it may have meant."""

    path: str
    known: tuple[str, ...]

    @property
    def suggestion(self) -> str | None:
        """The declared field whose name is closest to this one, if any is close."""
        name = self.path.rpartition(".")[2]
        lowered = {k.lower(): k for k in self.known}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=_HINT_CUTOFF)
        return lowered[close[0]] if close else None

    @property
    def reason(self) -> str:
        """`unknown field (did you mean x?)`, or the fields known there when none is close."""
        suggestion = self.suggestion
        if suggestion is not None:
            return f"unknown field (did you mean {suggestion}?)"
        return f"unknown field (known here: {', '.join(self.known)})"


def unknown_fields(value: object, type_: type[Any], path: str = "$") -> list[UnknownField]:
    """Every field of `value` (a decoded JSON object) that `type_` does not declare, in
    document order, with its path (`$.spec.trainSpec.trigger.checkPeriodSecond`)."""
    return list(_walk(value, msgspec.inspect.type_info(type_), path))


def unknown_spec_fields(obj: Mapping[str, Any]) -> list[UnknownField]:
    """The unknown fields of a Dataset's, LifelongLearningJob's or Model's `spec`, the part
    the controller interprets (its metadata, status and worker templates are not checked)."""
    resource = _RESOURCES.get(str(obj.get("kind", "")).lower())
    if resource is None:
        return []
    spec_type = next(f.type for f in msgspec.structs.fields(resource) if f.encode_name == "spec")
    return unknown_fields(obj.get("spec"), spec_type, "$.spec")


def _walk(value: object, info: msgspec.inspect.Type, path: str) -> Iterator[UnknownField]:
    struct = _struct_of(info)
    if struct is None or not isinstance(value, dict):
        return
    declared = {f.encode_name: f.type for f in struct.fields}
    for name, item in value.items():
        where = f"{path}.{name}"
        if name not in declared:
            yield UnknownField(where, tuple(declared))
        else:
            yield from _walk(item, declared[name], where)


def _struct_of(info: msgspec.inspect.Type) -> msgspec.inspect.StructType | None:
    """The struct a field holds, through `X | None` and `Annotated[X, ...]`."""
    if isinstance(info, msgspec.inspect.Metadata):
        return _struct_of(info.type)
    if isinstance(info, msgspec.inspect.UnionType):
        structs = [s for s in map(_struct_of, info.types) if s is not None]
        return structs[0] if len(structs) == 1 else None
    return info if isinstance(info, msgspec.inspect.StructType) else None
