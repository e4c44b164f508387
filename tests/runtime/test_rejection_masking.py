"""Every place a refusal goes, with the canary of `tests/wire/test_masking.py` in every
encoding: the refusal is recorded through `Rejections` (as intake and the HTTP endpoint do)
into a real Redis dead-letter stream and the service's own log handler; the dead-letter
record (its payload base64-decoded), its reason and the log text never show the canary."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.mqtt import MqttClient, MqttSettings
from service.adapters.redis_store import RedisStore
from service.keys import Keys
from service.logs import setup_logging
from service.metrics import Metrics
from service.runtime.rejections import Rejections
from service.wire import REJECTION_PAYLOAD_BYTES
from tests.servers import Server
from tests.wire.test_masking import leaks, secret_objects


@pytest.fixture
def store(redis_proc: Server) -> Iterator[RedisStore]:
    s = RedisStore(f"redis://127.0.0.1:{redis_proc.port}/0", Keys("t"), socket_timeout_s=2.0)
    yield s
    s.close()


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = setup_logging("text", logging.INFO, stream)
    yield stream
    logging.getLogger().removeHandler(handler)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(secret_objects(), st.data())
def test_no_place_a_refusal_goes_shows_the_canary(
    store: RedisStore, log_text: io.StringIO, found: tuple[str, str], data: st.DataObject
) -> None:
    inner, canary = found
    outer = '{"header": {"namespace": "default"}, "pad": "", "content": ' + inner + "}"
    cut_at = data.draw(st.integers(min_value=1, max_value=len(outer)))
    pad = "x" * max(REJECTION_PAYLOAD_BYTES - cut_at, 0)
    payload = outer.replace('"pad": ""', f'"pad": "{pad}"', 1).encode()
    publisher = MqttClient(MqttSettings(url="mqtt://127.0.0.1:1", client_id="unused"))
    rejections = Rejections(
        dead_letters=store.records,
        publisher=publisher,
        errors_topic="sedna/n/errors",
        metrics=Metrics(),
    )
    log_text.truncate(0)
    reason = f"$.content: refused {inner[: data.draw(st.integers(0, len(inner)))]}"
    rejections.refuse("sedna/n/downstream", "invalid", reason, payload, 0, publish=False)
    (record,) = store.records.dlq(count=1)
    rejection = json.loads(record)
    head = base64.b64decode(rejection["payload"]).decode("utf-8", "replace")
    for place, text in (
        ("dead-letter payload", head),
        ("dead-letter reason", rejection["reason"]),
        ("dead-letter record", record.decode("utf-8", "replace")),
        ("log", log_text.getvalue()),
    ):
        assert leaks(text, canary) == [], (place, text[-300:])
