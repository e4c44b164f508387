"""A canary secret, in every encoding we can think of, never shows in a Rejection.

The canary sits under a credential-named key (plain, or with escapes in its name or its
value), in an annotation holding the credential as a JSON string, in a resource given as a
JSON string or as base64 (standard or URL-safe) of its JSON, nested up to three encodings
deep; padding moves it across the 4 KiB cut at every offset. The Rejection's payload (its
base64 decoded) and reason are then searched for any trace of the canary: in the text as
it is, with every JSON string unescaped and every base64 run decoded, recursively.
"""

from __future__ import annotations

import base64
import codecs
import json
import re
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from service import masking
from service.wire import REJECTION_PAYLOAD_BYTES, make_rejection

#: Letters found nowhere else in these messages, nor in what base64 runs decode to: any one
#: of them in a view is a leak, however short the piece of the secret a cut let through.
GREEK = "ζκψωφ"
UNICODE_CANARY = "ζκψ-CANARY-ωφ"
#: An ASCII secret, as S3's are; searched for as any 6-character piece.
ASCII_CANARY = "Qz9Kw7Vb3Nm5Pt8Rj2"
KEYS = ("SECRET_ACCESS_KEY", "secret_access_key", "password", "ACCESS_KEY_ID", "token")


def _escape_some(text: str, picks: list[bool]) -> str:
    """JSON text of a string with the chosen characters written as \\uXXXX escapes."""
    body = json.dumps(text, ensure_ascii=False)[1:-1]
    out = []
    for i, char in enumerate(text):
        if picks[i % len(picks)] and char not in '"\\':
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(json.dumps(char, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"' if out else '"' + body + '"'


Encoding = Callable[[str], str]  # JSON text of an object -> JSON text of an object


def as_annotation(inner: str) -> str:
    return json.dumps({"metadata": {"annotations": {"sedna.io/credential": inner}}})


def as_json_string_content(inner: str) -> str:
    return json.dumps({"header": {"operation": "insert"}, "content": inner})


def as_base64_content(inner: str) -> str:
    return json.dumps({"content": base64.b64encode(inner.encode()).decode()})


def as_urlsafe_base64(inner: str) -> str:
    return json.dumps({"content": base64.urlsafe_b64encode(inner.encode()).decode()})


def as_nested_object(inner: str) -> str:
    return '{"spec": {"list": [1, {"deep": ' + inner + "}]}}"


def wrapped(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


def as_wrapped_base64(inner: str) -> str:
    """base64 with a line break every 61 characters (not a multiple of 4), as some tools do."""
    return json.dumps({"content": wrapped(base64.b64encode(inner.encode()).decode(), 61)})


def as_double_base64(inner: str) -> str:
    once = base64.b64encode(inner.encode())
    return json.dumps({"content": base64.b64encode(once).decode()})


def as_hex(inner: str) -> str:
    return json.dumps({"content": inner.encode().hex()})


ENCODINGS: list[Encoding] = [
    as_annotation,
    as_json_string_content,
    as_base64_content,
    as_urlsafe_base64,
    as_nested_object,
    as_wrapped_base64,
    as_double_base64,
    as_hex,
]


@st.composite
def secret_objects(draw: st.DrawFn) -> tuple[str, str]:
    """(JSON text holding the canary under a credential key, the canary)."""
    canary = draw(st.sampled_from([UNICODE_CANARY, ASCII_CANARY]))
    key = draw(st.sampled_from(KEYS))
    key_text = _escape_some(key, draw(st.lists(st.booleans(), min_size=1, max_size=5)))
    value_text = _escape_some(canary, draw(st.lists(st.booleans(), min_size=1, max_size=5)))
    inner = "{" + key_text + ": " + value_text + ', "other": "x"}'
    for encoding in draw(st.lists(st.sampled_from(ENCODINGS), max_size=3)):
        inner = encoding(inner)
    return inner, canary


# ---------------------------------------------------------------- finding a leak
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)(?:"|\\?\Z)', re.DOTALL)
_RUN = re.compile(r"[A-Za-z0-9+/_=-]{8,}")
_HEX_RUN = re.compile(r"(?:[0-9a-fA-F]{2}){4,}")
_LOOSE_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.?)", re.DOTALL)


def _loose(match: re.Match[str]) -> str:
    escape = match.group(1)
    if len(escape) == 5:
        return chr(int(escape[1:], 16))
    return {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(escape, escape)


def views(text: str, depth: int = 0) -> Iterator[str]:
    """The text, every JSON string in it unescaped, every base64 run in it decoded (at each
    alignment, either alphabet, as UTF-8; also with the line breaks of a wrapped encoding
    taken out) and every hex run decoded, recursively."""
    yield text
    if depth >= 4:
        return
    for body in _STRING.findall(text):
        try:
            unescaped = json.loads('"' + body + '"')
        except ValueError:  # cut short: escapes read one by one, a cut one dropped
            unescaped = _LOOSE_ESCAPE.sub(_loose, body)
        if unescaped != body:
            yield from views(unescaped, depth + 1)
    unwrapped = "".join(text.split())
    if unwrapped != text:
        yield from views(unwrapped, depth + 1)
    for run in _HEX_RUN.findall(text):
        for skip in range(2):
            chunk = run[skip:]
            decoded = bytes.fromhex(chunk[: len(chunk) // 2 * 2]).decode("utf-8", "replace")
            yield from views(decoded, depth + 1)
    for run in _RUN.findall(text):
        for skip in range(4):
            chunk = run[skip:].rstrip("=")
            chunk = chunk[: len(chunk) // 4 * 4]
            for decode in (base64.b64decode, base64.urlsafe_b64decode):
                try:
                    raw = decode(chunk)
                    decoded = raw.decode("utf-8")
                except ValueError as e:  # binascii.Error and UnicodeDecodeError
                    if not isinstance(e, UnicodeDecodeError) or e.start < len(raw) - 3:
                        continue
                    decoded = raw[: e.start].decode("utf-8")
                if len(decoded) >= 4:
                    yield from views(decoded, depth + 1)


def leaks(text: str, canary: str) -> list[str]:
    found = []
    for view in views(text):
        if canary == UNICODE_CANARY:
            found += [c for c in GREEK if c in view]
            found += ["CANARY"] if "CANARY" in view else []
        else:
            found += [
                canary[i : i + 6] for i in range(len(canary) - 5) if canary[i : i + 6] in view
            ]
    return found


def rejection_texts(payload: bytes, reason: str) -> tuple[str, str]:
    rejection = make_rejection("sedna/n/downstream", reason, payload, datetime.now(UTC))
    head = base64.b64decode(rejection.payload)
    assert len(head) <= REJECTION_PAYLOAD_BYTES
    return head.decode("utf-8", "replace"), rejection.reason


# ---------------------------------------------------------------- the properties
@settings(max_examples=400, deadline=None)
@given(secret_objects(), st.integers(0, 200), st.data())
def test_the_canary_never_shows_in_a_rejection(
    found: tuple[str, str], shift: int, data: st.DataObject
) -> None:
    inner, canary = found
    outer = '{"header": {"namespace": "default"}, "pad": "", "content": ' + inner + "}"
    # a cut anywhere in the message, and often right across the encoded secret
    cut_at = data.draw(st.integers(min_value=1, max_value=len(outer)))
    pad = REJECTION_PAYLOAD_BYTES - cut_at + shift % 3
    payload = outer.replace('"pad": ""', '"pad": "' + "x" * max(pad, 0) + '"', 1).encode()
    head, reason = rejection_texts(payload, f"$.content: refused ({inner[:200]})")
    assert leaks(head, canary) == [], head[-300:]
    assert leaks(reason, canary) == [], reason


@settings(max_examples=60, deadline=None)
@given(secret_objects())
def test_every_cut_across_the_boundary_is_masked(found: tuple[str, str]) -> None:
    """The same message cut at each of the offsets around the encoded secret."""
    inner, canary = found
    outer = '{"pad": "", "content": ' + inner + "}"
    for cut_at in range(len(outer) - len(inner), len(outer) + 1, max(1, len(inner) // 40)):
        pad = REJECTION_PAYLOAD_BYTES - cut_at
        payload = outer.replace('"pad": ""', '"pad": "' + "x" * pad + '"', 1).encode()
        head, _reason = rejection_texts(payload, "refused")
        assert leaks(head, canary) == [], (cut_at, head[-200:])


def test_the_leak_finder_sees_what_masking_removes() -> None:
    """Without masking, each encoding leaks: the finder is not blind."""
    for encoding in ENCODINGS:
        for canary in (UNICODE_CANARY, ASCII_CANARY):
            text = encoding(json.dumps({"SECRET_ACCESS_KEY": canary}))
            assert leaks(text, canary), encoding.__name__
            assert not leaks(masking.mask(text), canary), encoding.__name__


def test_content_that_decodes_to_words_is_left_as_it_was() -> None:
    for content in ("plain words", base64.b64encode(b"plain words").decode(), "",
                    base64.b64encode(b"plain words and more").hex()):  # fmt: skip
        text = json.dumps({"header": {"resourceKind": "dataset"}, "content": content})
        assert masking.mask(text) == text


def test_what_is_not_a_credential_is_left_as_it_was() -> None:
    text = json.dumps(
        {
            "header": {"resourceKind": "dataset"},
            "content": base64.b64encode(b'{"spec": {"url": "/data/a.txt"}}').decode(),
            "status": "completed1",
            "results": [{"url": "/out/train/1/m.pkl", "metrics": {"acc": [0.5]}}],
        }
    )
    assert masking.mask(text) == text


def test_content_that_cannot_be_decoded_is_masked_whole() -> None:
    """A resource hidden in an encoding masking cannot read (compressed, encrypted, a scheme
    of the sender's own) cannot be looked into: the content string goes whole."""
    resource = json.dumps({"metadata": {"annotations": {"sedna.io/credential": ASCII_CANARY}}})
    for content in (
        base64.b64encode(zlib.compress(resource.encode())).decode(),
        resource.encode().hex()[::-1],
        codecs.encode(base64.b64encode(resource.encode()).decode(), "rot13"),
    ):
        text = json.dumps({"header": {"resourceKind": "dataset"}, "content": content})
        assert json.loads(masking.mask(text))["content"] == masking.MASK, content


def test_undecodable_strings_are_masked_in_a_record_naming_credentials() -> None:
    opaque = base64.b64encode(zlib.compress(ASCII_CANARY.encode() * 3)).decode()
    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    record = {
        "metadata": {"name": "atcii-classifier-demo", "annotations": {"blob": opaque,
                                                                      "digest": digest}},
        "spec": {"url": "/data/trainData2024/a", "credentialName": "s3-creds"},
    }  # fmt: skip
    masked = json.loads(masking.mask(json.dumps(record)))
    assert masked["metadata"]["annotations"] == {"blob": masking.MASK, "digest": masking.MASK}
    # names, paths and words stay; the same strings in a record naming no credential stay too
    assert masked["metadata"]["name"] == "atcii-classifier-demo"
    assert masked["spec"]["url"] == "/data/trainData2024/a"
    del record["spec"]["credentialName"]
    assert json.loads(masking.mask(json.dumps(record))) == record


def test_non_json_text_and_invalid_utf8_are_masked_by_pattern() -> None:
    payload = b"\xff\xfeSECRET_ACCESS_KEY=" + ASCII_CANARY.encode() + b" url=mqtt://u:pw@h"
    masked = masking.mask_bytes(payload)
    assert masked.startswith(b"\xff\xfe")
    assert ASCII_CANARY.encode() not in masked and b"pw@" not in masked
