"""Log lines for people (text) and for collectors (one JSON object per line), secrets masked.

Structured fields travel as `extra=` keys (`job`, `event`, `outcome`...), so the same call
serves both formats. Credentials reach the service inside messages and URLs (the
`sedna.io/credential` annotation, `mqtt://user:pass@host`), so every record is passed through
`redact` on its way out: a log file must never become a credential store.

Messages quote what senders chose (topics, paths, names), so neither format lets a control
character through as itself: a line break, a carriage return, an escape sequence or a Unicode
line separator in a message or a field is written as a visible escape (`\\n`, `\\x1b`,
`\\u2028`), and no input can forge a log line or rewrite a terminal. In the text format a
record's traceback follows on lines that each start with two spaces, so every line that starts
with a timestamp is a record of its own.
"""


import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

HANDLER_NAME = "lifelong"
_MASK = "***"

# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("x", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}

_URL_PASSWORD_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<pw>[^\s/]*)@")
_SECRET_KEY = r"[A-Za-z0-9_-]*(?:secret_access_key|access_key_id|session_token|password|passwd)"
_SECRET_KEY_RE = re.compile(_SECRET_KEY, re.IGNORECASE)
_QUOTE = r"(?:\\?[\"'])?"
_SECRET_VALUE = (
    # a string quoted with \" as in JSON inside JSON: inner \\\" \\\\ \\n escapes or plain chars.
    # Quoted strings may also run to the end of the text unclosed: a payload cut short (the
    # errors topic keeps its first 4 KiB) can end half-way through a secret.
    r'\\"(?:\\\\\\[\\"]|\\\\[^\\"]|[^\\])*(?:\\"|\\?\Z)'
    r"|\"(?:[^\"\\]|\\.)*(?:\"|\\?\Z)"  # a double-quoted string
    r"|'[^']*'"  # a single-quoted string (Python reprs)
    r"|[^\s,;&}\])\"']+"  # a bare word (key=value, query strings)
)
_KEY_VALUE_RE = re.compile(
    rf"(?P<key>{_QUOTE}\b{_SECRET_KEY}\b{_QUOTE})(?P<sep>\s*[:=]\s*)(?P<value>{_SECRET_VALUE})",
    re.IGNORECASE,
)


def _mask_value(match: re.Match[str]) -> str:
    value = match["value"]
    if value.startswith('\\"'):
        masked = f'\\"{_MASK}\\"'
    elif value[0] in "\"'":
        masked = f"{value[0]}{_MASK}{value[0]}"
    else:
        masked = _MASK
    return f"{match['key']}{match['sep']}{masked}"


# Every match of the two patterns holds one of these (case-insensitively): a URL, or a
# secret-named key. Most log lines hold none, and the patterns cost ~30 us on a 100-character
# line where these substring tests cost well under 1.
_HINTS = ("://", "pass", "secret", "access", "session")


def redact(text: str) -> str:
    """Mask URL passwords and values of secret-named keys (SECRET_ACCESS_KEY, password...)."""
    # ASCII only: the patterns' IGNORECASE also matches four non-ASCII letters (U+017F
    # long s, U+212A Kelvin sign, ...) that lower() would not map to ASCII
    if text.isascii():
        lowered = text.lower()
        if not any(hint in lowered for hint in _HINTS):
            return text
    return _redact_all(text)


def _redact_all(text: str) -> str:
    text = _URL_PASSWORD_RE.sub(rf"\g<head>:{_MASK}@", text)
    return _KEY_VALUE_RE.sub(_mask_value, text)


def _redact_value(value: object) -> object:
    """Redact strings, and mask secret-named keys inside dicts and lists given as extras."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            k: _MASK if isinstance(k, str) and _SECRET_KEY_RE.fullmatch(k) else _redact_value(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


def extras(record: logging.LogRecord) -> dict[str, object]:
    """The `extra=` fields of a record, in the order they were given."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS}


class RedactFilter(logging.Filter):
    """Rewrites a record's message and string extras through `redact` (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True  # a malformed call; the handler reports it without our help
        record.msg, record.args = redact(message), None
        for key, value in extras(record).items():
            secret = _SECRET_KEY_RE.fullmatch(key) is not None
            setattr(record, key, _MASK if secret else _redact_value(value))
        return True


def _timestamp(record: logging.LogRecord) -> str:
    """UTC with milliseconds and a Z, e.g. 2026-12-02T17:00:00.123Z."""
    moment = datetime.fromtimestamp(record.created, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{int(record.msecs):03d}Z"


def _trailer(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """Exception and stack text of a record, redacted (tracebacks quote locals and URLs)."""
    parts = []
    if record.exc_info:
        parts.append(formatter.formatException(record.exc_info))
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return redact("\n".join(parts))


# C0 controls, DEL, C1 controls (U+0085 NEL among them) and the Unicode line and paragraph
# separators: everything that can end a line or drive a terminal.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# What `json.dumps(..., ensure_ascii=False)` leaves unescaped of those (it escapes C0 itself).
_JSON_UNESCAPED_RE = re.compile(r"[\x7f-\x9f\u2028\u2029]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match[str]) -> str:
    char = match[0]
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with every control character written as a visible escape (`\\n`, `\\x1b`...):
    what a log line or a command's output quotes of untrusted text can neither end the line
    nor drive the terminal (clear the screen, write the clipboard)."""
    # isprintable() is one C-speed pass; it is False for every character escaped here (and for
    # a few harmless ones, such as U+00A0, that the pattern then leaves as they are)
    if text.isprintable():
        return text
    return _CONTROL_RE.sub(_escape_char, text)


def _json_line(entry: dict[str, object]) -> str:
    """One JSON object on one line, with no raw control character even inside strings."""
    line = json.dumps(entry, default=str, ensure_ascii=False)
    if line.isprintable():
        return line
    return _JSON_UNESCAPED_RE.sub(lambda m: f"\\u{ord(m[0]):04x}", line)


def _text_value(value: object) -> str:
    if isinstance(value, str) and value and not re.search(r'[\s"=]', value):
        return value
    return json.dumps(value, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`<ts> <LEVEL> <logger> key=value ... <message>`, traceback on the following, indented
    lines; control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={_text_value(v)}" for k, v in extras(record).items())
        head = " ".join(
            part for part in (_timestamp(record), record.levelname, record.name, fields) if part
        )
        line = escape_controls(f"{head} {record.getMessage()}")
        trailer = _trailer(self, record)
        if not trailer:
            return line
        indented = "\n".join(f"  {escape_controls(part)}" for part in trailer.split("\n"))
        return f"{line}\n{indented}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the extras, and exc when present."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extras(record).items():
            entry.setdefault(key, value)
        trailer = _trailer(self, record)
        if trailer:
            entry["exc"] = trailer
        return _json_line(entry)


def setup_logging(
    fmt: Literal["text", "json"], level: int = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Install the service's handler on the root logger (replacing one installed before).

    Returns the handler so a caller (or a test) can remove it again.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactFilter())
    root.addHandler(handler)
    root.setLevel(level)
    return handler
