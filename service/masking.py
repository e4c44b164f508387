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
of what follows. A string that is one encoding as a whole is decoded whole: base64 wrapped
at any width (line breaks inside), hex, and either of them holding another
(double base64), then masked and encoded again. Last, the pattern-based
`service.logs.redact` runs over every string and the whole text, for what is not JSON
(`key=value`, URL passwords).

What cannot be decoded cannot be looked into, so it is masked whole: a `content` string (the
resource of an envelope) that looks encoded but does not decode to text (compressed,
encrypted, a scheme of the sender's own), and, in a record that names credentials anywhere
(a credential word in its text), any other string that does not either.

A secret cut off by the end of the text is masked like a whole one: a value runs to the end
of the text when nothing closes it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

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
#: A run of base64 (either alphabet) long enough to hold a small JSON object, perhaps
#: wrapped (line breaks inside).
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}(?:\r?\n[A-Za-z0-9+/_-]+)*={0,2}")
#: A whole string that may be one encoding (white space removed first): base64 or hex.
_BLOB = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){8,}[0-9a-fA-F]?")
#: A run of hex inside a text (a string cut short, a reason quoting one).
_HEX_RUN = re.compile(r"(?:[0-9a-fA-F]{2}){8,}")
#: The key of an envelope's resource, a JSON object or an encoding of one.
CONTENT_KEY = "content"


@dataclass(frozen=True)
class _Context:
    """How deep the masking is, and whether the record names credentials anywhere (then an
    encoded string that cannot be decoded is masked whole)."""

    embedding: int
    strict: bool

    def deeper(self) -> _Context:
        return _Context(self.embedding + 1, self.strict)


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
    lowered = text.lower().replace("-", "_")
    ctx = _Context(0, any(word in lowered for word in CREDENTIAL_WORDS))
    return redact(_mask_base64_runs(_mask_json(text, ctx), ctx))


def _mask_json(text: str, ctx: _Context) -> str:
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
        key = _unescape(_body(token.group())) if is_key else ""
        if is_key and (is_credential_key(key) or _unreadable_content(key, tokens, i + 2)):
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
            replaced = _mask_string(token.group(), ctx)
            if replaced is not None:
                out += [text[copied : token.start()], replaced]
                copied = token.end()
        i += 2 if is_key else 1
    out.append(text[copied:])
    return "".join(out)


def _unreadable_content(key: str, tokens: list[re.Match[str]], value: int) -> bool:
    """Whether `key` is an envelope's `content` whose value is a string that does not decode
    to text (compressed, encrypted, a scheme of the sender's own): what it hides cannot be
    looked into."""
    if key.lower() != CONTENT_KEY or value >= len(tokens) or tokens[value].lastgroup != "str":
        return False
    return not _readable(_unescape(_body(tokens[value].group())), 0)


def _readable(value: str, embedding: int) -> bool:
    """Whether a string is text masking can look into: JSON, words, or an encoding (base64,
    wrapped or not, or hex; perhaps encoded again) of such text."""
    if value.lstrip()[:1] in ("{", "["):
        return True
    compact = _compact(value)
    if len(compact) < len(value) and not _BLOB.fullmatch(compact):
        return True  # lines of text
    if len(compact) < 16 or not _BLOB.fullmatch(compact):
        return True  # too short to hide anything an encoding would not show
    text = _hex_text(compact) if _HEX.fullmatch(compact) else None
    if text is None:
        decoded = _base64_text(compact, any_text=True)
        text = None if decoded is None else decoded[0]
    if text is None:
        return False
    return embedding >= MAX_EMBEDDING or _readable(text, embedding + 1)


def _hex_text(compact: str) -> str | None:
    """The UTF-8 text a hex string encodes (an odd last digit dropped), or None."""
    return _utf8_prefix(bytes.fromhex(compact[: len(compact) // 2 * 2]))


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


def _mask_string(token: str, ctx: _Context) -> str | None:
    """The string token with what it holds masked, or None when nothing changed."""
    value = _unescape(_body(token))
    masked = _mask_embedded(value, ctx)
    if masked == value:
        return None
    return json.dumps(masked, ensure_ascii=True)


def _mask_embedded(value: str, ctx: _Context) -> str:
    """A string value with what it holds masked: JSON, an encoding as a whole (base64 wrapped
    or not, hex), base64 runs of JSON or text, or text."""
    blob = _decoded_blob(value)
    if blob is not None:
        return _mask_blob(value, blob, ctx)
    if ctx.strict and _looks_encoded(value) and not _readable(value, ctx.embedding):
        return MASK  # cannot be looked into, in a record that names credentials
    is_json = value.lstrip()[:1] in ("{", "[")
    has_base64 = _BASE64_RUN.search(value) is not None
    if not (is_json or has_base64 or _hinted(value)):
        return value
    if ctx.embedding >= MAX_EMBEDDING:
        return MASK
    if is_json:
        value = _mask_json(value, ctx.deeper())
    if has_base64:
        value = _mask_base64_runs(value, ctx)
    return redact(value)


def _mask_blob(value: str, blob: _Blob, ctx: _Context) -> str:
    """A string that is one encoding as a whole, its decoded text masked and encoded again
    (a cut one loses its incomplete end); decoded text saying nothing of credentials stays
    as it was."""
    if ctx.embedding >= MAX_EMBEDDING:
        return MASK
    masked = _mask_embedded(blob.text, ctx.deeper())
    if masked == blob.text and not blob.cut:
        return value
    return blob.encode(masked)


def _mask_base64_runs(text: str, ctx: _Context) -> str:
    """Each base64 or hex run of the text that decodes to JSON, to text naming a credential
    or to another encoding, decoded, masked and encoded again; a base64 run ending with an
    incomplete group (cut short) loses that group."""
    if ctx.embedding >= MAX_EMBEDDING:
        return text

    def one(match: re.Match[str]) -> str:
        run = match.group()
        decoded = _base64_text(_compact(run))
        if decoded is None:
            return run
        plain, urlsafe, cut = decoded
        inner = ctx.deeper()
        if _decoded_blob(plain) is not None:  # an encoding inside: decoded whole in turn
            masked = _mask_embedded(plain, inner)
        else:
            masked = redact(_mask_base64_runs(_mask_json(plain, inner), inner))
        if masked == plain and not cut:
            return run
        encoded = masked.encode("utf-8", "surrogatepass")  # unwrapped
        return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(encoded).decode()

    def one_hex(match: re.Match[str]) -> str:
        run = match.group()
        plain = _hex_text(run)
        if plain is None or not _worth_decoding(plain):
            return run
        masked = _mask_embedded(plain, ctx.deeper())
        return run if masked == plain else masked.encode("utf-8", "surrogatepass").hex()

    return _HEX_RUN.sub(one_hex, _BASE64_RUN.sub(one, text))


@dataclass(frozen=True)
class _Blob:
    """The text a whole string encodes, and how to encode a masked text the same way."""

    text: str
    encode: Callable[[str], str]
    cut: bool  # the string ended with an incomplete group, dropped


def _compact(value: str) -> str:
    """The string without line breaks: what a wrapped encoding is (words keep their spaces)."""
    return value.replace("\r", "").replace("\n", "")


def _looks_encoded(value: str) -> bool:
    """Whether a string looks like base64 (upper and lower case letters and digits mixed)
    or hex (32 digits or more) as a whole; names, words and paths do not."""
    compact = _compact(value)
    if compact.startswith("/") or not _BLOB.fullmatch(compact):
        return False
    if _HEX.fullmatch(compact) and len(compact) >= 32:
        return True
    return all(any(test(c) for c in compact) for test in (str.isupper, str.islower, str.isdigit))


def _decoded_blob(value: str) -> _Blob | None:
    """The text a whole string encodes as hex or base64 (the line breaks of a wrapped
    encoding ignored): when it is JSON, names a credential or is itself such an encoding."""
    compact = _compact(value)
    if len(compact) < len(value) and not _BLOB.fullmatch(compact):
        return None  # lines of text, not a wrapped encoding
    if _HEX.fullmatch(compact):
        text = _hex_text(compact)
        if text is not None and _worth_decoding(text):
            return _Blob(text, lambda t: t.encode("utf-8", "surrogatepass").hex(),
                         len(compact) % 2 == 1)  # fmt: skip
    if _BLOB.fullmatch(compact):  # base64, wrapped or not
        decoded = _base64_text(compact)
        if decoded is not None:
            text, urlsafe, cut = decoded
            encoder = base64.urlsafe_b64encode if urlsafe else base64.b64encode
            return _Blob(text, lambda t: encoder(t.encode("utf-8", "surrogatepass")).decode(), cut)
    return None


def _utf8_prefix(raw: bytes) -> str | None:
    """Bytes as UTF-8 text, a character cut in two at the end dropped; None if not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(raw) - 3:
            return None
        return raw[: e.start].decode("utf-8")


def _worth_decoding(text: str) -> bool:
    """Whether decoded text may hold a credential: JSON, a hint, or another encoding."""
    if text.lstrip()[:1] in ("{", "[") or _hinted(text):
        return True
    compact = _compact(text)
    return len(compact) >= 16 and _BLOB.fullmatch(compact) is not None


def _hinted(text: str) -> bool:
    """Whether the text may name a credential: a hint word, or an escape that may spell one."""
    lowered = text.lower()
    return "\\u" in text or any(hint in lowered for hint in _HINTS)


def _base64_text(run: str, *, any_text: bool = False) -> tuple[str, bool, bool] | None:
    """The text a base64 run encodes (an incomplete last group dropped), whether it uses
    the URL-safe alphabet and whether it was cut short; None unless it decodes to UTF-8
    text that is JSON, names a credential or is another encoding (any text: `any_text`)."""
    urlsafe = any(c in "-_" for c in run)
    if urlsafe and any(c in "+/" for c in run):
        return None
    usable = run[: len(run) // 4 * 4]
    try:
        raw = (base64.urlsafe_b64decode if urlsafe else base64.b64decode)(usable)
    except (binascii.Error, ValueError):
        return None
    text = _utf8_prefix(raw)
    if text is None or not (any_text or _worth_decoding(text)):
        return None
    return text, urlsafe, len(usable) < len(run)
