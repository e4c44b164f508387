"""Delivering a task's reports to the controller: over MQTT, or over HTTP as Sedna's library."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from service import config as config_mod
from service.adapters.mqtt import MqttClient
from service.errors import PermanentError, TransientError
from service.worker.tasks import Task

log = logging.getLogger("service.worker")

OWNER_KIND = "lifelonglearningjob"
PUBACK_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
REPORT_RETRY_S = 60.0


def worker_message(
    task: Task,
    status: str,
    results: Sequence[dict[str, Any]] = (),
    owner_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Sedna's WorkerMessage for this task."""
    return {
        "name": task.worker_name,
        "namespace": task.namespace,
        "ownerName": task.job,
        "ownerKind": OWNER_KIND,
        "ownerInfo": dict(owner_info or {}),
        "kind": task.kind,
        "status": status,
        "results": list(results),
    }


class Reporter(Protocol):
    """Delivers one worker report to the controller."""

    def report(self, worker: str, message: dict[str, Any]) -> None: ...


class MqttReporter:
    """Publishes reports on the worker topic of the task's namespace (the one the broker's
    ACL grants a namespace's workers and the node's runner) and waits for the PUBACK."""

    def __init__(self, client: MqttClient, cfg: config_mod.Config) -> None:
        self._client = client
        self._cfg = cfg

    def report(self, worker: str, message: dict[str, Any]) -> None:
        topic = self._cfg.worker_topic(message["namespace"], worker)
        ticket = self._client.publish(topic, json.dumps(message).encode())
        if not ticket.wait(PUBACK_TIMEOUT_S):
            # paho keeps the message and sends it after reconnecting; say so and go on
            log.warning(
                "no PUBACK for %s's %s report yet; it stays queued", worker, message["status"]
            )


class HttpReporter:
    """POSTs reports to `{lc_server}/sedna/workers/{worker}/info`, as Sedna's library does."""

    def __init__(self, lc_server: str, retry_s: float = REPORT_RETRY_S, token: str = "") -> None:
        self._base = lc_server.rstrip("/")
        self._retry_s = retry_s
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def report(self, worker: str, message: dict[str, Any]) -> None:
        retrying = Retrying(
            stop=stop_after_delay(self._retry_s),
            wait=wait_exponential_jitter(multiplier=0.2, max=5),
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )
        retrying(self._post, worker, json.dumps(message).encode())

    def _post(self, worker: str, body: bytes) -> None:
        request = urllib.request.Request(
            f"{self._base}/sedna/workers/{worker}/info",
            data=body,
            headers=self._headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S):
                return
        except urllib.error.HTTPError as e:
            reason = e.read(512).decode("utf-8", "replace")
            if e.code >= 500:
                raise TransientError(f"controller answered {e.code}: {reason}") from e
            refused = f"controller refused {worker}'s report ({e.code}): {reason}"
            raise PermanentError(refused) from e
        except (urllib.error.URLError, OSError) as e:
            raise TransientError(f"controller at {self._base} unreachable: {e}") from e
