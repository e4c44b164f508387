"""A canary S3 secret in `sedna.io/credential` never leaks out of the controller.

Resources carrying the canary are sent valid (a full round runs, one dataset read from moto's
S3 with the canary credential) and invalid (rejected for a bad outputDir, a bad or half
credential, broken annotation JSON, base64 content as Sedna's GM sends it, a payload cut at
4 KiB in the middle of the secret). Then the canary is looked for, as plain text, as any
10-character piece of it and base64-encoded, in: the controller's log, every errors-topic
payload (base64-decoded), /metrics, every Redis key but the resource store (the credential
store the controller needs) and the output of every `lifelong` command there is.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import redis

from service.embedded.processes import free_port
from tests.harness import (
    NODE,
    NS,
    PREFIX,
    dataset_resource,
    job_resource,
    worker_message,
)
from tests.stack import Stack

SECRET = "canary-s3cr3t-value"
KEY_ID = "AKIDCANARY123"
PIECE_CHARS = 10
JOB = "canary-job"
DATASET = "canary-dataset"
S3_DATASET = "canary-s3-dataset"
REJECTION_HEAD_BYTES = 4096


def credential(endpoint: str, **extra: str) -> dict[str, str]:
    return {
        "ACCESS_KEY_ID": KEY_ID,
        "SECRET_ACCESS_KEY": SECRET,
        "s3-endpoint": endpoint,
        "s3-usehttps": "0",
        **extra,
    }


def _b64_forms(secret: bytes) -> list[str]:
    """The base64 text the secret turns into at each of the three byte alignments."""
    forms = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret + b"\0\0").decode()
        skip = (shift * 4 + 2) // 3  # characters still mixed with the padding in front
        keep = (len(secret) * 4) // 3 - 2  # stop before characters mixed with what follows
        forms.append(encoded[skip : skip + keep])
    return forms


SECRET_FORMS = [
    SECRET[i : i + PIECE_CHARS] for i in range(len(SECRET) - PIECE_CHARS + 1)
] + _b64_forms(SECRET.encode())


def leaks(text: str) -> list[str]:
    """The forms of the canary secret found in `text` (empty when it is clean)."""
    return [form for form in SECRET_FORMS if form in text]


def test_base64_forms_find_the_secret_at_any_alignment() -> None:
    """The detector itself must work, or every clean verdict below means nothing."""
    for prefix in (b"", b"x", b"xy", b'{"a":"'):
        encoded = base64.b64encode(prefix + SECRET.encode() + b'"}').decode()
        assert leaks(encoded), prefix
    assert leaks(f"...{SECRET[3:14]}...")
    assert not leaks(base64.b64encode(b"canary-s3 and nothing else").decode())


# ------------------------------------------------------------------------------ sending


def envelope(resource: dict[str, Any], *, as_base64: bool = False) -> dict[str, Any]:
    content: Any = resource
    if as_base64:
        content = base64.b64encode(json.dumps(resource).encode()).decode()
    return {
        "header": {
            "namespace": NS,
            "resourceKind": resource["kind"].lower(),
            "resourceName": resource["metadata"]["name"],
            "operation": "insert",
        },
        "content": content,
    }


def with_annotation(resource: dict[str, Any], text: str) -> dict[str, Any]:
    resource["metadata"]["annotations"] = {"sedna.io/credential": text}
    return resource


def cut_inside_secret(resource: dict[str, Any]) -> bytes:
    """The envelope padded (by an annotation before the credential) so that the errors
    topic's 4 KiB head ends half-way through the secret."""
    annotations = resource["metadata"]["annotations"]
    resource["metadata"]["annotations"] = {"example.com/padding": "", **annotations}
    data = json.dumps(envelope(resource)).encode()
    pad = REJECTION_HEAD_BYTES - (data.index(SECRET.encode()) + PIECE_CHARS + 2)
    resource["metadata"]["annotations"]["example.com/padding"] = "p" * pad
    data = json.dumps(envelope(resource)).encode()
    at = data.index(SECRET.encode())
    assert at < REJECTION_HEAD_BYTES < at + len(SECRET)
    return data


def invalid_resources(out: str, endpoint: str) -> dict[str, bytes]:
    """Refused inserts, each carrying the canary; the key says why each is refused."""
    good = credential(endpoint)
    bad_out = job_resource("canary-bad-out", DATASET, "relative/out", credential=good)
    as_string = job_resource("canary-str", DATASET, "rel/out", credential=good)
    return {
        "relative outputDir": json.dumps(envelope(bad_out)).encode(),
        "relative outputDir, base64 content": json.dumps(
            envelope(job_resource("canary-b64", DATASET, "../up", credential=good), as_base64=True)
        ).encode(),
        "bad s3-usehttps": json.dumps(
            envelope(
                job_resource(
                    "canary-https",
                    DATASET,
                    out,
                    credential=credential(endpoint, **{"s3-usehttps": "maybe"}),
                )
            )
        ).encode(),
        "secret without key id": json.dumps(
            envelope(
                with_annotation(
                    dataset_resource("canary-half", "/data/x.txt"),
                    json.dumps({"SECRET_ACCESS_KEY": SECRET}),
                )
            )
        ).encode(),
        "annotation not JSON": json.dumps(
            envelope(
                with_annotation(
                    dataset_resource("canary-broken", "/data/x.txt"),
                    '{"SECRET_ACCESS_KEY": "' + SECRET + '", oops',
                )
            )
        ).encode(),
        "annotation values not strings": json.dumps(
            envelope(
                with_annotation(
                    dataset_resource("canary-number", "/data/x.txt"),
                    json.dumps({"ACCESS_KEY_ID": 7, "SECRET_ACCESS_KEY": SECRET}),
                )
            )
        ).encode(),
        "cut at 4 KiB inside the secret": cut_inside_secret(
            job_resource("canary-cut", DATASET, "relative/out", credential=good)
        ),
        "content as a JSON string": json.dumps(
            {**envelope(as_string), "content": json.dumps(as_string)}
        ).encode(),
        "credential key written with an escape": json.dumps(
            envelope(
                with_annotation(
                    job_resource("canary-esc", DATASET, "rel/out"),
                    '{"ACCESS_KEY_ID": "' + KEY_ID + '", "SECRET_ACCESS_KE\\u0059": "'
                    + SECRET + '"}',
                )
            )
        ).encode(),
        "annotation name written with an escape": json.dumps(
            envelope(job_resource("canary-ann", DATASET, "rel/out", credential=good))
        ).encode().replace(b"sedna.io/credential", b"sedna.io/credentia\\u006c"),
    }


# ------------------------------------------------------------------------------ reading


def errors_payloads(stack: Stack) -> list[str]:
    """Every errors-topic message as text, with its `payload` base64-decoded."""
    texts = []
    for rejection in stack.cloud.errors():
        decoded = base64.b64decode(rejection["payload"]).decode("utf-8", "replace")
        texts.append(json.dumps(rejection) + "\n" + decoded)
    return texts


def redis_dump(url: str) -> Iterator[tuple[str, str]]:
    """(key, text of its whole value) for every key, whatever its type."""
    client: redis.Redis[bytes] = redis.Redis.from_url(url)
    try:
        for raw_key in client.scan_iter(count=1000):
            key = raw_key.decode()
            kind = client.type(raw_key).decode()
            value: object
            if kind == "string" and ":resource:" in key:
                value = zlib.decompress(client.get(raw_key) or b"")  # the store compresses them
            elif kind == "string":
                value = client.get(raw_key)
            elif kind == "hash":
                value = client.hgetall(raw_key)
            elif kind == "stream":
                value = client.xrange(raw_key)
            elif kind == "list":
                value = client.lrange(raw_key, 0, -1)
            elif kind == "set":
                value = client.smembers(raw_key)
            elif kind == "zset":
                value = client.zrange(raw_key, 0, -1, withscores=True)
            else:
                value = kind
            yield key, _text(value)
    finally:
        client.close()


def _text(value: object) -> str:
    """bytes anywhere inside `value` decoded leniently, so a secret in msgpack shows too; a
    rejection record (the dead-letter stream) also shows its base64-decoded payload."""
    if isinstance(value, bytes):
        return value.decode("latin-1") + _rejection_payload(value)
    if isinstance(value, dict):
        return " ".join(f"{_text(k)}={_text(v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return " ".join(_text(v) for v in value)
    return str(value)


def _rejection_payload(data: bytes) -> str:
    try:
        record = json.loads(data)
        return "\n" + base64.b64decode(record["payload"]).decode("latin-1")
    except (ValueError, TypeError, KeyError):
        return ""


# Runs many commands in one process (each start costs ~0.7 s): every --help and every config
# error, which stop before any server is touched.
_BATCH = """
import contextlib, io, json, sys
from service import cli
results = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    results.append([argv, code, out.getvalue()])
print(json.dumps(results))
"""


def _run(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _output(proc: subprocess.Popen[str]) -> str:
    output, _ = proc.communicate(timeout=60)
    return f"{_label(list(proc.args))} -> {proc.returncode}\n{output}"


def _label(argv: list[str]) -> str:
    """The command line as a heading, the canary (passed on purpose) masked."""
    words = [Path(argv[0]).name, *argv[1:]]
    return "$ " + " ".join(words).replace(SECRET, "<canary>")


def cli_outputs(redis_url: str, mqtt_url: str, bad_files: list[Path]) -> list[str]:
    """Every command's --help, config errors, and the commands that read state or files."""
    env = {"LIFELONG_REDIS_URL": redis_url, "LIFELONG_MQTT_URL": mqtt_url, "NODENAME": NODE}
    lifelong = [str(Path(sys.executable).with_name("lifelong"))]
    top = _output(_run([*lifelong, "--help"], env))
    commands = re.findall(r"^    (\w[\w-]*)\s", top, re.MULTILINE)
    assert "serve" in commands, top
    # each command that exists now, on the state the controller wrote and on bad manifests
    candidates = [
        ["get", "jobs", "-o", "json"],
        ["get", "datasets", "-o", "json"],
        ["describe", "job", JOB],
        ["describe", "dataset", DATASET],
        ["describe", "dataset", S3_DATASET],
        *(["validate", "-f", str(f)] for f in bad_files),
        # apply checks with validate's code; two of them show it prints no more than that
        *(["apply", "-f", str(f), "--timeout", "3"] for f in (bad_files[0], bad_files[-1])),
        ["serve", "--mqtt-url", f"mqtts://lifelong:{SECRET}@127.0.0.1:1?ca=/no/such/ca.pem",
         "--http-addr", "127.0.0.1:0"],
    ]  # fmt: skip
    procs = [_run([*lifelong, *argv], env) for argv in candidates if argv[0] in commands]
    batch = [[command, "--help"] for command in commands] + [
        ["serve", "--mqtt-url", f"mqtt://lifelong:{SECRET}@broker:notaport"],
        ["serve", "--mqtt-url", f"ftp://lifelong:{SECRET}@broker:1883"],
        ["serve", "--redis-url", f"redis://:{SECRET}@127.0.0.1:99999/0"],
        ["serve", "--redis-url", f"redis://:{SECRET}@127.0.0.1:6379/notanumber"],
        ["serve", "--lease-seconds", "0", "--mqtt-url", f"mqtt://u:{SECRET}@127.0.0.1:1"],
    ]
    batch_proc = _run([sys.executable, "-c", _BATCH, json.dumps(batch)], env)
    outputs = [top, *(_output(proc) for proc in procs)]
    batch_out, _ = batch_proc.communicate(timeout=60)
    for argv, code, text in json.loads(batch_out):
        if argv[0] == "serve" and "--help" not in argv:
            assert code == 2 and "Traceback" not in text and text.strip(), (argv, code, text)
        outputs.append(f"{_label(['lifelong', *argv])} -> {code}\n{text}")
    return outputs


# ------------------------------------------------------------------------------ the test


def test_canary_secret_never_leaks(stack: Stack, s3_endpoint: str) -> None:
    cloud = stack.cloud
    data = stack.samples()
    out = stack.workdir / "out"
    bucket = make_bucket(s3_endpoint)
    controller = stack.serving()
    good = credential(s3_endpoint)

    # valid resources carrying the canary: the credential is used, a round runs
    cloud.insert_dataset(DATASET, data, credential=good)
    cloud.insert_dataset(S3_DATASET, f"s3://{bucket}/d.txt", credential=good)
    cloud.downstream(
        "lifelonglearningjob",
        "insert",
        job_resource(JOB, DATASET, str(out), credential=good),
        as_base64=True,
    )
    cloud.wait_for(lambda: 3 in cloud.samples(S3_DATASET), 15, "the S3 dataset read")
    cloud.wait_status(JOB, "train", "ready")
    model = out / "train" / "1" / "model.pkl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"trained")
    cloud.report(JOB, "train", "completed", str(model))
    cloud.wait_status(JOB, "eval", "ready")

    # invalid ones, each refused onto the errors topic
    refused = invalid_resources(str(out), s3_endpoint)
    for payload in refused.values():
        cloud.publish(f"{PREFIX}/{NODE}/downstream", payload)
    # and a worker report (for an unknown job) quoting the secret where a secret-named key is
    report = worker_message("no-such-job", "train", "failed")
    report["ownerInfo"] = {"SECRET_ACCESS_KEY": SECRET}
    cloud.publish_report(report)
    cloud.wait_for(lambda: len(cloud.errors()) >= len(refused) + 1, 15, "every rejection")
    assert len(cloud.errors()) == len(refused) + 1, [e["reason"] for e in cloud.errors()]

    places: dict[str, str] = {"controller log": controller.log()}
    for i, text in enumerate(errors_payloads(stack)):
        places[f"errors message {i}"] = text
    places["/metrics"] = fetch(f"http://127.0.0.1:{controller.http_port}/metrics")
    credential_store: list[str] = []
    for key, text in redis_dump(stack.redis_url):
        if ":resource:" in key:
            credential_store.append(key)
            continue
        places[f"redis {key}"] = text
    bad_files = []  # the refused resources again, as manifests for validate and apply
    for i, payload in enumerate(refused.values()):
        content = json.loads(payload)["content"]
        path = stack.workdir / f"refused-{i}.json"
        if isinstance(content, str):  # base64 of the JSON, or the JSON as a string
            text = content.encode() if content.startswith("{") else base64.b64decode(content)
        else:
            text = json.dumps(content).encode()
        path.write_bytes(text)
        bad_files.append(path)
    for output in cli_outputs(stack.redis_url, stack.mqtt_url, bad_files):
        heading, _, text = output.partition("\n")
        places[heading] = text

    # the canary did reach the controller, and only its credential store holds it
    assert any(leaks(text) for key, text in redis_dump(stack.redis_url) if key in credential_store)
    assert any(":history:" in place for place in places), "history streams were inspected"
    found = {place: leaks(text) for place, text in places.items() if leaks(text)}
    assert found == {}, _show(found, places)
    # the access key id is masked wherever the secret is (it names the account)
    assert not [p for p, text in places.items() if KEY_ID in text and "lifelong" not in p]


def _show(found: dict[str, list[str]], places: dict[str, str]) -> str:
    parts = []
    for place, forms in found.items():
        text = places[place]
        at = text.find(forms[0])
        parts.append(f"{place}: {forms[0]!r} in ...{text[max(0, at - 200) : at + 60]!r}")
    return "\n".join(parts)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def make_bucket(endpoint: str) -> str:
    """A bucket holding a 3-sample dataset, made with the canary credential itself."""
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
    )
    bucket = f"canary-{os.getpid()}-{free_port()}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="d.txt", Body=b"a 1\nb 2\nc 3\n")
    s3.close()
    return bucket
