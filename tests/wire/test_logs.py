"""Log formats (text and JSON lines), extras, and redaction of credentials."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service import logs
from service.logs import redact, setup_logging

Install = Callable[[str], io.StringIO]


@pytest.fixture
def install() -> Iterator[Install]:
    """Install the service handler on a StringIO; restore the root logger afterwards."""
    root = logging.getLogger()
    level = root.level
    handlers: list[logging.Handler] = []

    def _install(fmt: str) -> io.StringIO:
        stream = io.StringIO()
        handlers.append(setup_logging(fmt, logging.INFO, stream))  # type: ignore[arg-type]
        return stream

    yield _install
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(level)


def test_json_lines_parse_with_extras(install: Install) -> None:
    stream = install("json")
    log = logging.getLogger("service.runtime")
    log.info("applied %s", "insert", extra={"job": "default/x", "event": "insert", "outcome": "ok"})
    log.warning("second", extra={"attempt": 2, "models": [{"format": "pb"}]})
    log.debug("not shown at INFO")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "INFO"
    assert first["logger"] == "service.runtime"
    assert first["msg"] == "applied insert"
    assert (first["job"], first["event"], first["outcome"]) == ("default/x", "insert", "ok")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert second["level"] == "WARNING"
    assert second["attempt"] == 2
    assert second["models"] == [{"format": "pb"}]


def test_json_exception_is_one_line(install: Install) -> None:
    stream = install("json")
    try:
        raise RuntimeError("boom mqtt://u:topsecret@h")
    except RuntimeError:
        logging.getLogger("service.x").exception("failed")
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert "RuntimeError: boom" in entry["exc"]
    assert "topsecret" not in line


def test_text_format(install: Install) -> None:
    stream = install("text")
    logging.getLogger("service.runtime").info("message", extra={"job": "default/x"})
    logging.getLogger("service.runtime").info("spaced", extra={"reason": "two words"})
    first, second = stream.getvalue().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO service\.runtime job=default/x message",
        first,
    )
    assert second.endswith('service.runtime reason="two words" spaced')


def test_setup_twice_replaces_the_handler(install: Install) -> None:
    first = install("text")
    second = install("json")
    logging.getLogger("service.t").info("once")
    assert first.getvalue() == ""
    assert json.loads(second.getvalue())["msg"] == "once"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connecting to mqtt://user:s3cr3t@broker:1883", "s3cr3t"),
        ("redis://:s3cr3t@redis:6379/0 down", "s3cr3t"),
        ("SECRET_ACCESS_KEY=s3cr3t region=x", "s3cr3t"),
        ("AWS_SECRET_ACCESS_KEY: s3cr3t", "s3cr3t"),
        ('{"ACCESS_KEY_ID": "AKIAS3CR3T", "s3-endpoint": "minio"}', "AKIAS3CR3T"),
        ("{'password': 's3cr3t'}", "s3cr3t"),
        ("https://h/x?password=s3cr3t&next=1", "s3cr3t"),
        (json.dumps({"sedna.io/credential": json.dumps({"SECRET_ACCESS_KEY": 's3"cr3t'})}),
         "cr3t"),
    ],
)  # fmt: skip
def test_redact_masks_secrets(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert "***" in masked


def test_redact_keeps_ordinary_text() -> None:
    text = 'job default/x phase=train url=s3://bucket/key {"s3-endpoint": "minio:9000"}'
    assert redact(text) == text
    assert redact("mqtt://broker:1883") == "mqtt://broker:1883"
    assert redact("mqtt://user:s3cr3t@b:1883") == "mqtt://user:***@b:1883"


def test_redacted_json_stays_valid() -> None:
    inner = json.dumps({"ACCESS_KEY_ID": "AK", "SECRET_ACCESS_KEY": 'x"y\\z', "s3-usehttps": "0"})
    outer = json.dumps({"metadata": {"annotations": {"sedna.io/credential": inner}}})
    decoded = json.loads(
        json.loads(redact(outer))["metadata"]["annotations"]["sedna.io/credential"]
    )
    assert decoded == {"ACCESS_KEY_ID": "***", "SECRET_ACCESS_KEY": "***", "s3-usehttps": "0"}


def test_log_records_are_redacted(install: Install) -> None:
    stream = install("json")
    log = logging.getLogger("service.s3")
    log.info("creds %s", {"SECRET_ACCESS_KEY": "s3cr3t"})
    credential = {"ACCESS_KEY_ID": "s3cr3t", "s3-endpoint": "minio"}
    log.info(
        "url",
        extra={"broker": "mqtts://u:s3cr3t@h", "password": "s3cr3t", "credential": credential},
    )
    output = stream.getvalue()
    assert "s3cr3t" not in output
    second = json.loads(output.splitlines()[1])
    assert second["broker"] == "mqtts://u:***@h"
    assert second["password"] == "***"
    assert second["credential"] == {"ACCESS_KEY_ID": "***", "s3-endpoint": "minio"}


@settings(max_examples=400, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            [" ", "=", ":", '"', "'", "\\", "@", "/", "x", "Pass", "WORD", "wd", "secret_",
             "ACCESS", "_key", "_id", "Session", "_token", "://", "mqtt", "user", "\u017f",
             "\u212a", "\u0130", "é"]
        ),
        max_size=20,
    ).map("".join)
)
def test_the_quick_path_masks_exactly_what_the_patterns_mask(text: str) -> None:
    """The substring pre-check skips only lines the patterns would leave as they are."""
    assert redact(text) == logs._redact_all(text)


@pytest.mark.parametrize(
    "text",
    [
        "Session_Token=abc",
        "x SECRET_ACCESS_KEY: abc",
        "access_key_id='abc'",
        "PassWd=abc",
        "password = abc",
        "https://u:p@host",
        "pa\u017f\u017fword=abc",  # long s: IGNORECASE matches it to s
        "access_\u212aey_id=abc",  # Kelvin sign: matched to k
        "sess\u0130on_token=abc",  # dotted capital I: matched to i
    ],
)
def test_the_quick_path_lets_every_kind_of_secret_through_to_the_patterns(text: str) -> None:
    assert logs._redact_all(text) != text
    assert redact(text) == logs._redact_all(text)


# ------------------------------------------------------------------ control characters

FORGED = "2026-01-01T00:00:00.000Z ERROR service.runtime forged"
# every kind of character that can end a line or drive a terminal, and how the text shows it
CONTROLS = {
    "\n": r"\n", "\r": r"\r", "\r\n": r"\r\n", "\x1b[2J": r"\x1b[2J", "\x00": r"\x00",
    "\x07": r"\x07", "\x0b": r"\x0b", "\x0c": r"\x0c", "\x1c": r"\x1c", "\x7f": r"\x7f",
    "\x85": r"\x85", "\x9b": r"\x9b", "\u2028": r"\u2028", "\u2029": r"\u2029",
}  # fmt: skip
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def records_of(output: str) -> list[str]:
    """The lines of a log, split on every line boundary any tool might honour."""
    return output.splitlines()


@pytest.mark.parametrize("control", CONTROLS)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_input_forges_a_log_line(install: Install, fmt: str, control: str) -> None:
    """A sender-chosen string in the message, a field's value or a field's name stays on one
    line with its control characters escaped; JSON still decodes to exactly what was logged."""
    stream = install(fmt)
    hostile = f"w{control}{FORGED}"
    log = logging.getLogger("service.runtime")
    log.warning("rejected message on %s: bad", hostile, extra={"worker": hostile})
    log.warning("field names too", extra={hostile: "v"})
    output = stream.getvalue()
    lines = records_of(output)
    assert len(lines) == 2, output
    assert not any(line.startswith(FORGED) for line in lines)
    assert RAW_CONTROL.search(output) is None, output
    if fmt == "json":
        first, second = (json.loads(line) for line in lines)
        assert first["msg"] == f"rejected message on {hostile}: bad"
        assert first["worker"] == hostile
        assert second[hostile] == "v"
    else:
        assert f"rejected message on w{CONTROLS[control]}{FORGED}: bad" in lines[0]


def test_text_escapes_are_readable(install: Install) -> None:
    stream = install("text")
    logging.getLogger("service.http").info("path /a\nb\r\tc\x1bd\u2028e")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(r"path /a\nb\r\tc\x1bd\u2028e")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_traceback_cannot_forge_a_line(install: Install, fmt: str) -> None:
    """An exception's message quoting input keeps to the record's own (indented) lines."""
    stream = install(fmt)
    try:
        raise ValueError(f"bad name w\n{FORGED} \x1b[2J password=hunter2")
    except ValueError:
        logging.getLogger("service.runtime").exception("failed")
    output = stream.getvalue()
    assert "hunter2" not in output
    assert RAW_CONTROL.search(output) is None
    lines = records_of(output)
    assert not any(line.startswith(FORGED) for line in lines)
    if fmt == "text":
        head, *trailer = lines
        assert head.endswith("failed")
        assert trailer and all(line.startswith("  ") for line in trailer)
        assert any(line.strip() == f"{FORGED} \\x1b[2J password=***" for line in trailer)
    else:
        assert len(lines) == 1


def test_printable_text_is_left_as_it_is(install: Install) -> None:
    stream = install("text")
    text = 'job default/x é 中文 \u00a0 tab-free "quoted" back\\slash'
    logging.getLogger("service.runtime").info(text)
    assert stream.getvalue().rstrip("\n").endswith(text)
