"""The caps that bound what one message may cost: the message's shape (depth, arrays and
objects, values), found before parsing, and each free-form field's own caps (ownerInfo,
results, metrics, templates, annotations), every refusal naming the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service import wire
from service.errors import InvalidMessage
from service.wire import Shape, decode_envelope, decode_worker_message, shape
from tests.wire.test_messages import JOB, envelope, invalid, worker_with


def nested(depth: int, leaf: object = 0) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_object(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def refused(data: bytes, decode: Any = decode_worker_message) -> InvalidMessage:
    return invalid(data, decode)


# ---------------------------------------------------------------- the shape, before parsing
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='ab[]{},"\\:\n\u00e9', max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet='k[]{},"\\', max_size=4), children, max_size=4),
    max_leaves=30,
)


def oracle(value: object, level: int = 0) -> Shape:
    """Depth, containers and commas of a value, by walking it."""
    if isinstance(value, list | dict):
        items = list(value.values()) if isinstance(value, dict) else value
        found = [oracle(item, level + 1) for item in items]
        return Shape(
            depth=max([level + 1, *(f.depth for f in found)]),
            containers=1 + sum(f.containers for f in found),
            commas=max(len(items) - 1, 0) + sum(f.commas for f in found),
        )
    return Shape(depth=level, containers=0, commas=0)


@settings(max_examples=300)
@given(json_values, st.booleans())
def test_the_shape_is_found_without_parsing(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    found = shape(text, depth_bound=-1)  # always the full scan
    assert found == oracle(value)
    quick = shape(text)  # a few brackets: upper bounds, as the caps need
    assert quick.depth >= found.depth and quick.containers >= found.containers


def test_brackets_and_escaped_quotes_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": '\\"[[[{' * 100, "t": ["\\", '"', "]]]"]}).encode()
    assert shape(text, depth_bound=-1) == Shape(depth=2, containers=2, commas=3)


def test_too_many_arrays_and_objects_are_refused_before_parsing() -> None:
    flat = worker_with(results=[{"url": "/o/m", "x": [[]] * (wire.MAX_CONTAINERS + 1)}])
    error = refused(flat)
    assert error.code == "too_many" and error.path == "$"
    assert f"more than {wire.MAX_CONTAINERS} arrays and objects" in error.reason


def test_the_issues_payload_is_refused_at_its_shape() -> None:
    """~1 MiB of 62-deep nested lists in ownerInfo: within the size and depth limits, it
    used to cost 0.5-1.3 s of CPU to parse, twice; now it is never parsed."""
    unit = json.dumps(nested(61))
    body = ",".join([unit] * ((wire.MAX_PAYLOAD_BYTES - 400) // (len(unit) + 1)))
    filled = b'{"x": [' + body.encode() + b"]}"
    data = worker_with(ownerInfo={"x": []}).replace(b'{"x": []}', filled)
    assert len(data) <= wire.MAX_PAYLOAD_BYTES
    assert shape(data).depth <= wire.MAX_NESTING_DEPTH
    error = refused(data)
    assert error.code == "too_many" and "arrays and objects" in error.reason


def test_too_many_values_are_refused() -> None:
    data = worker_with(results=[{"url": "/o/m", "x": [0] * (wire.MAX_VALUES + 1)}])
    error = refused(data)
    assert error.code == "too_many" and f"more than {wire.MAX_VALUES} values" in error.reason
    job = copy.deepcopy(JOB)
    job["spec"]["trainSpec"]["template"]["n"] = [0] * (wire.MAX_VALUES + 1)
    assert refused(envelope(job), decode_envelope).code == "too_many"


# ---------------------------------------------------------------- ownerInfo
def test_owner_info_may_be_eight_levels_deep_not_nine() -> None:
    depth = wire.MAX_OWNER_INFO_DEPTH
    decode_worker_message(worker_with(ownerInfo=deep_object(depth)))
    error = refused(worker_with(ownerInfo=deep_object(depth + 1)))
    assert (error.path, error.code) == ("$.ownerInfo", "too_deep")
    assert f"nesting deeper than {depth} levels" in error.reason
    # counted below the field: brackets elsewhere in the message do not count
    wide = {"a": [[1]], "b": [[2]], "c": [[3]], "d": [[4]], "e": deep_object(depth - 1)}
    decode_worker_message(worker_with(ownerInfo=wide))


def test_owner_info_is_at_most_64_kib() -> None:
    limit = wire.MAX_OWNER_INFO_BYTES
    decode_worker_message(worker_with(ownerInfo={"s": "x" * (limit - 9)}))  # {"s": "..."}
    error = refused(worker_with(ownerInfo={"s": "x" * limit}))
    assert (error.path, error.code) == ("$.ownerInfo", "too_large")
    assert f"larger than {limit} bytes" in error.reason


def test_owner_info_is_kept_as_it_came() -> None:
    text = b'{"b": [1, 2.50, "\\u00e9"],  "a": {}}'
    data = worker_with(ownerInfo={}).replace(b'"ownerInfo": {}', b'"ownerInfo": ' + text)
    owner_info = decode_worker_message(data).owner_info
    assert owner_info is not None and bytes(owner_info) == text


# ---------------------------------------------------------------- results and metrics
def test_at_most_100_results() -> None:
    model = {"url": "/output/train/1/m"}
    decode_worker_message(worker_with(results=[model] * wire.MAX_RESULTS))
    error = refused(worker_with(results=[model] * (wire.MAX_RESULTS + 1)))
    assert (error.path, error.code) == ("$.results", "too_many")


def test_a_result_is_at_most_eight_levels_deep() -> None:
    ok = {"url": "/o/m", "x": nested(wire.MAX_RESULT_DEPTH - 1)}
    decode_worker_message(worker_with(results=[{"url": "/o/m"}, ok]))
    deep = {"url": "/o/m", "x": nested(wire.MAX_RESULT_DEPTH)}
    error = refused(worker_with(results=[{"url": "/o/m"}, deep]))
    assert (error.path, error.code) == ("$.results[1]", "too_deep")


def test_a_metric_list_holds_at_most_1000_numbers() -> None:
    limit = wire.MAX_METRIC_VALUES
    decode_worker_message(worker_with(results=[{"url": "/o/m", "metrics": {"acc": [0.5] * limit}}]))
    too_long = {"url": "/o/m", "metrics": {"acc": [0.5], "f1": [0.5] * (limit + 1)}}
    error = refused(worker_with(results=[too_long]))
    assert (error.path, error.code) == ("$.results[0].metrics.f1", "too_many")


# ---------------------------------------------------------------- templates and annotations
@pytest.mark.parametrize("spec", ["trainSpec", "evalSpec", "deploySpec"])
def test_templates_have_a_size_and_depth_cap(spec: str) -> None:
    job = copy.deepcopy(JOB)
    job["spec"][spec]["template"] = {"x": "y" * wire.MAX_TEMPLATE_BYTES}
    error = refused(envelope(job), decode_envelope)
    assert (error.path, error.code) == (f"$.spec.{spec}.template", "too_large")
    job["spec"][spec]["template"] = deep_object(wire.MAX_TEMPLATE_DEPTH + 1)
    error = refused(envelope(job), decode_envelope)
    assert (error.path, error.code) == (f"$.spec.{spec}.template", "too_deep")
    job["spec"][spec]["template"] = deep_object(wire.MAX_TEMPLATE_DEPTH)
    decode_envelope(envelope(job))


def test_annotations_are_at_most_256_kib_together() -> None:
    job = copy.deepcopy(JOB)
    half = wire.MAX_ANNOTATIONS_BYTES // 2
    job["metadata"]["annotations"] = {"a": "x" * half, "b": "x" * (half - 2)}
    decode_envelope(envelope(job))
    job["metadata"]["annotations"]["c"] = "x"
    error = refused(envelope(job), decode_envelope)
    assert (error.path, error.code) == ("$.metadata.annotations", "too_large")
