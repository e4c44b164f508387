"""MQTT adapter: paho-mqtt 2.x held by composition, speaking MQTT 5 with a 3.1.1 fallback.

- `url`: the broker URL (host, credentials, TLS files, a pinned protocol).
- `settings`: what a client is told (session, will, timings), checked before connecting.
- `policy`: what to do when the broker refuses or ends a connection (fall back to 3.1.1,
  back off after a takeover of our client id); pure, tested without a broker.
- `tickets`: publish tickets, done (or refused) once the broker's PUBACK arrived.
- `status`: what is known of the current connection (connected, subscribed, refused), and
  the `Inbound` messages received on it.
- `paho_client`: making, starting and stopping one paho client object.
- `client`: `MqttClient`, the connection itself.

The names other code uses are importable from this package.
"""

from service.adapters.mqtt.client import MqttClient
from service.adapters.mqtt.policy import ConnectRefusal, fallback_protocol
from service.adapters.mqtt.settings import MqttSettings
from service.adapters.mqtt.status import Inbound
from service.adapters.mqtt.tickets import PublishTicket
from service.adapters.mqtt.url import PROTOCOL_WORDS, MqttEndpoint, parse_mqtt_url

__all__ = [
    "PROTOCOL_WORDS",
    "ConnectRefusal",
    "Inbound",
    "MqttClient",
    "MqttEndpoint",
    "MqttSettings",
    "PublishTicket",
    "fallback_protocol",
    "parse_mqtt_url",
]
