"""The GM link's pure parts: the address it dials and the frames it writes.

The expected frames are literals: what Go's encoding/json and gorilla's WriteJSON write for
the same message (compact, Go's field order, ``< > &`` and U+2028/9 escaped, base64 content,
a trailing newline), checked once against a Go program using gorilla/websocket 1.5.
"""

from __future__ import annotations

import base64
import json

import pytest

from service.adapters.broker_url import TlsFiles
from service.adapters.gm_frames import HELLO_FRAME, encode_frame, go_json_string
from service.adapters.gm_link import GmEndpoint, parse_gm_address
from service.config import Config
from service.errors import ConfigError

STATUS_HEADER = {
    "namespace": "default",
    "resourceKind": "dataset",
    "resourceName": "ds-1",
    "operation": "status",
    "id": "s1-17-0",
}


@pytest.mark.parametrize(
    ("header", "content", "expected"),
    [
        pytest.param(
            STATUS_HEADER,
            b'{"numberOfSamples":42}',
            '{"header":{"namespace":"default","resourceKind":"dataset","resourceName":"ds-1",'
            '"operation":"status","id":"s1-17-0"},"content":"eyJudW1iZXJPZlNhbXBsZXMiOjQyfQ=="}\n',
            id="status-frame",
        ),
        pytest.param(
            {"id": "x", "operation": "status", "resourceName": "j", "namespace": "ns"},
            b"{}",
            '{"header":{"namespace":"ns","resourceKind":"","resourceName":"j",'
            '"operation":"status","id":"x"},"content":"e30="}\n',
            id="header-fields-in-gos-order-whatever-the-mapping-order",
        ),
    ],
)
def test_frames_are_what_go_writes(header: dict[str, str], content: bytes, expected: str) -> None:
    assert encode_frame(header, content) == expected


def test_nil_and_empty_content_are_null_and_empty_string() -> None:
    header = {"namespace": "a", "resourceKind": "b", "resourceName": "c", "operation": "d"}
    assert encode_frame(header, None).endswith('"content":null}\n')
    assert encode_frame(header, b"").endswith('"content":""}\n')


def test_strings_are_escaped_as_go_escapes_them() -> None:
    header = {
        "namespace": "ns<&>\u2028\u2029",
        "resourceKind": "k\b\f\x01\x7f",
        "resourceName": 'é\n\t\r"\\',
        "operation": "delete",
        "id": "\ud800",
    }
    assert encode_frame(header, None) == (
        '{"header":{"namespace":"ns\\u003c\\u0026\\u003e\\u2028\\u2029",'
        '"resourceKind":"k\\b\\f\\u0001\x7f","resourceName":"é\\n\\t\\r\\"\\\\",'
        '"operation":"delete","id":"\\ufffd"},"content":null}\n'
    )


def test_go_json_string_round_trips_through_a_json_reader() -> None:
    value = "a<b>&c\u2028\x00é"
    assert json.loads(go_json_string(value)) == value


def test_content_is_standard_padded_base64_of_the_bytes() -> None:
    content = bytes(range(256))
    frame = json.loads(encode_frame(STATUS_HEADER, content))
    assert frame["content"] == base64.standard_b64encode(content).decode()
    assert frame["content"].endswith("=")  # 256 bytes: padded, as Go's StdEncoding


def test_hello_frame_is_an_empty_message_header() -> None:
    assert HELLO_FRAME == '{"namespace":"","resourceKind":"","resourceName":"","operation":""}\n'


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("gm.sedna:9000", GmEndpoint("ws://gm.sedna:9000/")),
        ("  10.0.0.7:9000 ", GmEndpoint("ws://10.0.0.7:9000/")),
        ("[::1]:9000", GmEndpoint("ws://[::1]:9000/")),
        ("gm", GmEndpoint("ws://gm/")),
        ("ws://gm:9000", GmEndpoint("ws://gm:9000/")),
        ("WS://gm:9000/sedna", GmEndpoint("ws://gm:9000/sedna")),
        ("wss://gm:443", GmEndpoint("wss://gm:443/", TlsFiles())),
        (
            "wss://gm/?ca=/etc/ca.pem&cert=/etc/tls.crt&key=/etc/tls.key&insecure=1",
            GmEndpoint("wss://gm/", TlsFiles("/etc/ca.pem", "/etc/tls.crt", "/etc/tls.key", True)),
        ),
        ("wss://gm/?ca=/ca.pem&insecure=0", GmEndpoint("wss://gm/", TlsFiles(ca_path="/ca.pem"))),
    ],
)
def test_addresses_parse(address: str, expected: GmEndpoint) -> None:
    assert parse_gm_address(address) == expected


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("", "empty"),
        ("gm:port", "port must be a number"),
        ("gm:70000", "port must be a number"),
        ("gm:0", "port must be in"),
        ("http://gm:9000", "not ws:// or wss://"),
        ("ws://:9000", "no host"),
        ("gm:9000/path", "expected host:port"),
        ("ws://gm/#frag", "no #fragment"),
        ("ws://gm/?ca=/ca.pem", "need wss://"),
        ("wss://gm/?cert=/c.pem", "together"),
        ("wss://gm/?ca=/a&ca=/b", "given twice"),
        ("wss://gm/?token=x", "unknown query parameter 'token'"),
        ("wss://gm/?insecure=maybe", "insecure= must be 1 or 0"),
        ("wss://gm/?ca", "malformed"),
    ],
)
def test_bad_addresses_say_what_is_wrong(address: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_gm_address(address)


def test_config_reads_the_address_from_sedna_s_variable_or_ours() -> None:
    base = {"LIFELONG_NODE_NAME": "edge-1"}
    assert Config.from_env(base).gm_address == ""
    assert Config.from_env({**base, "GM_ADDRESS": "gm:9000"}).gm_address == "gm:9000"
    ours = {**base, "GM_ADDRESS": "gm:9000", "LIFELONG_GM_ADDRESS": "wss://gm:443"}
    assert Config.from_env(ours).gm_address == "wss://gm:443"
    assert Config.from_env(ours, {"gm_address": ""}).gm_address == ""  # explicit flag: off


@pytest.mark.parametrize("variable", ["LIFELONG_GM_ADDRESS", "GM_ADDRESS"])
def test_bad_address_is_one_line_naming_the_variable_without_the_password(variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"LIFELONG_NODE_NAME": "e", variable: "wss://u:hunter2@gm:1/?cert=/c"})
    message = str(caught.value)
    assert message.startswith(f"{variable}: GM address ")
    assert "cert= and key=" in message
    assert "\n" not in message
    assert "hunter2" not in message


def test_bare_address_with_credentials_hides_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_gm_address("user:hunter2@gm:9000")
    assert "hunter2" not in str(caught.value)
