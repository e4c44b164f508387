"""Credentials masked by structure, in refused messages before they are published, stored
or logged.

A refused message is JSON, or the first bytes of JSON, or not JSON at all. `mask` reads it
as JSON tokens (tolerating a text cut anywhere, even inside a string or an escape) and
replaces the value of every credential-named key (`SECRET_ACCESS_KEY`, `password`,
`sedna.io/credential`, ...: `is_credential_key`) with "***", at any depth. Names are compared
after JSON unescaping, so `SECRET_ACCESS_KE\\u0059` is found too. String values are looked
into: one holding JSON (a resource given as a JSON string, an annotation holding the
credential's JSON) is masked the same way, recursively; one holding base64 of JSON or of
text naming a secret (how Sedna's GM sends a resource) is decoded, masked and encoded again,
dropping the last characters of a base64 string cut short, which could only show a few bytes
of what follows. Last, the pattern-based `service.logs.redact` runs over every string and the
whole text, for what is not JSON (`key=value`, URL passwords).

A secret cut off by the end of the text is masked like a whole one: a value runs to the end
of the text when nothing closes it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

from service.logs import redact

MASK = "***"
#: How deep strings inside strings are looked into; deeper, a string that names a secret is
#: masked whole.
MAX_EMBEDDING = 6
#: Words that make a key a credential's (compared in lower case, "-" read as "_").
CREDENTIAL_WORDS = (
    "secret",
    "password",
    "passwd",
    "token",
    "credential",
    "access_key",
    "accesskey",
    "private_key",
    "privatekey",
    "api_key",
    "apikey",
    "authorization",
)
_HINTS = (*CREDENTIAL_WORDS, "access", "key", "://")

_TOKEN = re.compile(
    r"""
    (?P<str>"(?:[^"\\]++|\\.)*+(?:"|\\?\Z))  # a string, or one cut off by the end
    |(?P<colon>:)
    |(?P<open>[\[{])
    |(?P<close>[\]}])
    |(?P<comma>,)
    |(?P<bare>[^\s"\[\]{},:]+)  # numbers, literals, anything else
    """,
    re.DOTALL | re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)|\\\Z", re.DOTALL)
_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
#: A run of base64 (either alphabet) long enough to hold a small JSON object.
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")


def is_credential_key(name: str) -> bool:
    """Whether a key names a credential (its value is masked)."""
    lowered = name.lower().replace("-", "_")
    return any(word in lowered for word in CREDENTIAL_WORDS)


def mask_bytes(payload: bytes) -> bytes:
    """`mask` for bytes in any encoding: bytes that are not UTF-8 pass through as they are."""
    text = payload.decode("utf-8", "surrogateescape")
    return mask(text).encode("utf-8", "surrogateescape")


def mask(text: str) -> str:
    """The text with every credential masked (see the module's docstring)."""
    return redact(_mask_base64_runs(_mask_json(text, 0), 0))


def _mask_json(text: str, embedding: int) -> str:
    tokens = list(_TOKEN.finditer(text))
    out: list[str] = []
    copied = 0  # text[:copied] is in `out` already
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.lastgroup != "str":
            i += 1
            continue
        is_key = i + 1 < len(tokens) and tokens[i + 1].lastgroup == "colon"
        if is_key and is_credential_key(_unescape(_body(token.group()))):
            start = i + 2
            if start >= len(tokens):
                break  # cut after the colon: no value to mask
            end = _value_end(tokens, start)
            if end > start:
                out += [text[copied : tokens[start].start()], f'"{MASK}"']
                copied = tokens[end - 1].end() if end <= len(tokens) else len(text)
            i = end
            continue
        if not is_key:
            replaced = _mask_string(token.group(), embedding)
            if replaced is not None:
                out += [text[copied : token.start()], replaced]
                copied = token.end()
        i += 2 if is_key else 1
    out.append(text[copied:])
    return "".join(out)


def _value_end(tokens: list[re.Match[str]], start: int) -> int:
    """The index after the last token of the value starting at `start` (a container runs to
    its closing bracket, or to the end when the text stops first); `start` when there is no
    value there (a comma or a closing bracket)."""
    kind = tokens[start].lastgroup
    if kind in ("str", "bare"):
        return start + 1
    if kind != "open":
        return start
    depth = 0
    for j in range(start, len(tokens)):
        kind = tokens[j].lastgroup
        depth += 1 if kind == "open" else -1 if kind == "close" else 0
        if depth == 0:
            return j + 1
    return len(tokens)


def _body(token: str) -> str:
    """A string token's escaped content, without its quotes (a cut one has no closing one)."""
    closed = len(token) >= 2 and token.endswith('"') and not _ends_escaped(token[:-1])
    return token[1:-1] if closed else token[1:]


def _ends_escaped(text: str) -> bool:
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def _unescape(body: str) -> str:
    """JSON string content unescaped; an escape cut off by the end is dropped."""

    def one(match: re.Match[str]) -> str:
        escape = match.group(1)
        if escape is None:
            return ""
        if escape.startswith("u") and len(escape) == 5:
            return chr(int(escape[1:], 16))
        return _SIMPLE_ESCAPES.get(escape, escape)

    return _join_surrogates(_ESCAPE.sub(one, body))


def _join_surrogates(text: str) -> str:
    """Pairs of UTF-16 surrogates (as JSON spells characters beyond U+FFFF) made one."""
    if not any("\ud800" <= c <= "\udbff" for c in text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")


def _mask_string(token: str, embedding: int) -> str | None:
    """The string token with what it holds masked, or None when nothing changed."""
    value = _unescape(_body(token))
    masked = _mask_embedded(value, embedding)
    if masked == value:
        return None
    return json.dumps(masked, ensure_ascii=True)


def _mask_embedded(value: str, embedding: int) -> str:
    """A string value with what it holds masked: JSON, base64 of JSON or text, or text."""
    is_json = value.lstrip()[:1] in ("{", "[")
    has_base64 = _BASE64_RUN.search(value) is not None
    if not (is_json or has_base64 or _hinted(value)):
        return value
    if embedding >= MAX_EMBEDDING:
        return MASK
    if is_json:
        value = _mask_json(value, embedding + 1)
    if has_base64:
        value = _mask_base64_runs(value, embedding)
    return redact(value)


def _mask_base64_runs(text: str, embedding: int) -> str:
    """Each base64 run of the text that decodes to JSON, or to text naming a credential,
    decoded, masked and encoded again; a run ending with an incomplete group (cut short)
    loses that group."""
    if embedding >= MAX_EMBEDDING:
        return text

    def one(match: re.Match[str]) -> str:
        run = match.group()
        decoded = _base64_text(run)
        if decoded is None:
            return run
        plain, urlsafe, cut = decoded
        masked = redact(_mask_base64_runs(_mask_json(plain, embedding + 1), embedding + 1))
        if masked == plain and not cut:
            return run
        encoded = masked.encode("utf-8", "surrogatepass")
        return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(encoded).decode()

    return _BASE64_RUN.sub(one, text)


def _hinted(text: str) -> bool:
    """Whether the text may name a credential: a hint word, or an escape that may spell one."""
    lowered = text.lower()
    return "\\u" in text or any(hint in lowered for hint in _HINTS)


def _base64_text(run: str) -> tuple[str, bool, bool] | None:
    """The text a base64 run encodes (an incomplete last group dropped), whether it uses
    the URL-safe alphabet and whether it was cut short; None unless it decodes to UTF-8
    text that is JSON or names a credential."""
    urlsafe = any(c in "-_" for c in run)
    if urlsafe and any(c in "+/" for c in run):
        return None
    usable = run[: len(run) // 4 * 4]
    try:
        raw = (base64.urlsafe_b64decode if urlsafe else base64.b64decode)(usable)
    except (binascii.Error, ValueError):
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(raw) - 3:
            return None
        text = raw[: e.start].decode("utf-8")  # a character cut in two by the cut
    if text.lstrip()[:1] not in ("{", "[") and not _hinted(text):
        return None
    return text, urlsafe, len(usable) < len(run)
