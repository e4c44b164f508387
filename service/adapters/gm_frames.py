"""The frames of Sedna's GM protocol, byte for byte as Sedna's local controller writes them.

Every frame is one text message written by gorilla/websocket's ``WriteJSON``: Go's
``encoding/json`` encoder, so compact JSON, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped
as ``\\u003c`` and so on, and a trailing newline. The message is
``{"header":{"namespace","resourceKind","resourceName","operation"},"content":...}`` where
``content`` is a Go ``[]byte``: standard base64 with padding of the resource's or status's
JSON, ``null`` when nil. Readers use ``ReadJSON`` and so accept text or binary messages,
ignore unknown fields (the ``id`` we add to the header) and decode base64 leniently.

Right after the handshake the local controller writes one frame holding an empty message
header, `HELLO_FRAME`; the GM reads it as a message with an empty operation and ignores it
(with a log line).

Received frames are not parsed here: `GmFrame` carries their bytes to the caller's decoder,
and `GmRejected` says why the link could not take one.
"""


import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# What Sedna's local controller writes first on every connection: an empty message header.
HELLO_FRAME = '{"namespace":"","resourceKind":"","resourceName":"","operation":""}\n'
# The header fields of Sedna's MessageHeader, in the order Go marshals them.
HEADER_FIELDS = ("namespace", "resourceKind", "resourceName", "operation")

# Go's encoding/json escapes these in strings (HTML safety, JavaScript line terminators);
# Python's json module leaves them alone.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def go_json_string(value: str) -> str:
    """``value`` as Go's ``encoding/json`` writes a string (Go 1.22 and later).

    Both escape ``"``, ``\\``, ``\\b``, ``\\f``, ``\\n``, ``\\r``, ``\\t`` by their short forms
    and other control characters as ``\\u00xx`` (lower-case hex), and keep other non-ASCII as
    UTF-8; Go also escapes ``< > &`` and U+2028/U+2029, and writes ``\\ufffd`` for what is not
    valid Unicode (a lone surrogate here).
    """
    text = json.dumps(value, ensure_ascii=False).translate(_GO_ESCAPES)
    return _LONE_SURROGATE.sub(r"\\ufffd", text)


def encode_frame(header: Mapping[str, str], content_json: bytes | None) -> str:
    """One frame as Sedna's local controller writes it with gorilla's ``WriteJSON``.

    The header's four Sedna fields come first in Go's order (a missing one as ``""``, Go's
    zero value), then any other keys of ``header`` (``id``) in their given order, which Go
    readers ignore. ``content_json`` goes as standard base64 with padding (Go's ``[]byte``);
    None is Go's nil slice, ``null``. The frame ends with the newline Go's encoder adds.
    """
    fields = [(name, header.get(name, "")) for name in HEADER_FIELDS]
    fields += [(name, value) for name, value in header.items() if name not in HEADER_FIELDS]
    head = ",".join(f"{go_json_string(name)}:{go_json_string(value)}" for name, value in fields)
    if content_json is None:
        content = "null"
    else:
        content = '"' + base64.b64encode(content_json).decode("ascii") + '"'
    return f'{{"header":{{{head}}},"content":{content}}}\n'


def _nothing_to_free() -> None:
    pass


@dataclass(frozen=True)
class GmFrame:
    """One frame received from the GM: its bytes as they came (text frames as UTF-8, never
    decoded or checked here) and when it arrived (``time.time()``).

    ``taken`` frees the frame's place in the link's hand-off: the receiver calls it once,
    from any thread, when it no longer holds the frame (made durable, refused or dropped).
    """

    data: bytes
    received_at: float
    taken: Callable[[], None] = _nothing_to_free


@dataclass(frozen=True)
class GmRejected:
    """A frame the link could not take (too large: the connection was closed to drop it)."""

    reason: str
    received_at: float
