"""A credential sent to a running controller hidden in encodings masking used to miss: base64
wrapped at an odd width, base64 of base64, hex, and one it cannot decode at all. Each message
is refused (its content is not a resource), and neither the errors topic nor the controller's
log shows the secret in any of those encodings."""

from __future__ import annotations

import base64
import json
import zlib

from tests.harness import NODE, PREFIX, dataset_resource
from tests.stack import Stack
from tests.wire.test_masking import leaks

SECRET = "Qz9Kw7Vb3Nm5Pt8Rj2"  # an ASCII secret, as S3's are


def wrapped(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


def test_secrets_in_encodings_never_reach_the_errors_topic_or_the_log(stack: Stack) -> None:
    controller = stack.serving()
    credential = json.dumps({"ACCESS_KEY_ID": "AKID", "SECRET_ACCESS_KEY": SECRET})
    resource = dataset_resource("ds", "/data/d.txt")
    resource["metadata"]["annotations"] = {"sedna.io/credential": credential}
    plain = json.dumps(resource).encode()
    contents = {
        "wrapped": wrapped(base64.b64encode(plain).decode(), 61),
        "double": base64.b64encode(base64.b64encode(plain)).decode(),
        "hex": plain.hex(),
        "compressed": base64.b64encode(zlib.compress(plain)).decode(),
    }
    for content in contents.values():
        envelope = {"header": {"namespace": "default", "resourceKind": "dataset",
                               "resourceName": "ds", "operation": "insert"},
                    "content": content}  # fmt: skip
        stack.cloud.publish(f"{PREFIX}/{NODE}/downstream", json.dumps(envelope).encode())
    errors = stack.cloud.wait_for(
        lambda: (found := stack.cloud.errors()) and len(found) >= len(contents) and found,
        30, "a rejection of each message",
    )  # fmt: skip
    for rejection in errors:
        head = base64.b64decode(rejection["payload"]).decode("utf-8", "replace")
        assert leaks(head, SECRET) == [], head
        assert leaks(rejection["reason"], SECRET) == [], rejection["reason"]
    undecodable = [json.loads(base64.b64decode(r["payload"]))["content"] for r in errors]
    assert "***" in undecodable  # the compressed one, masked whole
    assert leaks(controller.log(), SECRET) == []
