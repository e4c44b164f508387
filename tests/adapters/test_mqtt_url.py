"""The MQTT broker URL: defaults, credentials, TLS files, the protocol pin, and refusals that
never show the password."""

from __future__ import annotations

import traceback

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from service.adapters.broker_url import MqttEndpoint, TlsFiles, parse_mqtt_url
from service.errors import ConfigError
from service.urls import redact_url


def test_parse_plain_url_defaults_port() -> None:
    assert parse_mqtt_url("mqtt://broker.local") == MqttEndpoint(
        "broker.local", 1883, None, None, False, TlsFiles()
    )


def test_parse_url_with_credentials_and_port() -> None:
    host, port, user, password, tls, _, _ = parse_mqtt_url("mqtt://edge%40x:p%2Fss@10.0.0.5:1999")
    assert (host, port, user, password, tls) == ("10.0.0.5", 1999, "edge@x", "p/ss", False)


def test_parse_mqtts_with_tls_options() -> None:
    endpoint = parse_mqtt_url(
        "mqtts://u:pw@broker?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&insecure=1"
    )
    assert endpoint.port == 8883
    assert endpoint.tls
    assert endpoint.tls_options == TlsFiles("/etc/ca.pem", "/c.pem", "/k.pem", insecure=True)


@pytest.mark.parametrize(
    ("query", "protocol"),
    [
        ("", None),
        ("?protocol=5", MQTTProtocolVersion.MQTTv5),
        ("?protocol=5.0", MQTTProtocolVersion.MQTTv5),
        ("?protocol=3.1.1", MQTTProtocolVersion.MQTTv311),
        ("?protocol=311", MQTTProtocolVersion.MQTTv311),
    ],
)
def test_parse_protocol_pin(query: str, protocol: MQTTProtocolVersion | None) -> None:
    assert parse_mqtt_url(f"mqtt://broker{query}").protocol == protocol
    tls = parse_mqtt_url(f"mqtts://broker{query}{'&' if query else '?'}insecure=1")
    assert (tls.protocol, tls.tls_options.insecure) == (protocol, True)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mqtt://user:s3cret@broker?protocol=4", "protocol= must be one of 5, 5.0, 3.1.1, 311"),
        ("mqtt://user:s3cret@broker?protocol=5&protocol=5", "given twice"),
        ("http://user:s3cret@broker:1883", "unsupported scheme 'http'"),
        ("mqtt://user:s3cret@:1883", "no host"),
        ("mqtt://user:s3cret@broker:99999", "port"),
        ("mqtt://user:s3cr/et@broker", "port"),
        ("mqtt://user:s3cret@broker/topic", "no path"),
        ("mqtt://user:s3cret@broker?ca=/ca.pem", "need the mqtts:// scheme"),
        ("mqtts://user:s3cret@broker?color=red", "unknown query parameter 'color'"),
        ("mqtts://user:s3cret@broker?cert=/c.pem", "together"),
        ("mqtts://user:s3cret@broker?insecure=maybe", "insecure="),
    ],
)
def test_bad_urls_raise_config_error_without_the_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mqtt_url(url)
    message = str(caught.value)
    assert problem in message
    assert "s3cr" not in message
    # Nor anywhere in the printed traceback (no chained urllib error quoting it).
    assert "s3cr" not in "".join(traceback.format_exception(caught.value))


def test_redact_url_masks_only_the_password() -> None:
    assert redact_url("mqtts://edge:hunter2@b:8883?ca=/x") == "mqtts://edge:***@b:8883?ca=/x"
    assert redact_url("mqtt://b:1883") == "mqtt://b:1883"
