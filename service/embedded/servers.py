"""Single servers on free ports: a mosquitto broker and a redis-server, not started yet.

Both keep their data in their working directory; the broker is configured as the configs
shipped with the controller (in-flight cap, persistence) and speaks on 127.0.0.1 only.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.embedded.process import Server, find_binary, free_port


def mosquitto_server(workdir: Path, extra_conf: str = "", port: int | None = None) -> Server:
    binary = find_binary("mosquitto", "/usr/sbin/mosquitto")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        + ("allow_anonymous true\n" if "allow_anonymous" not in extra_conf else "")
        + "set_tcp_nodelay true\n"
        + "persistence true\n"
        + f"persistence_location {workdir}/\n"
        + "autosave_interval 1\n"
        + "max_queued_messages 100000\n"
        + "max_inflight_messages 100\n"  # as the configs we ship
        # as root, mosquitto drops to the `mosquitto` user, who cannot write a 0700 temp dir
        + ("user root\n" if os.geteuid() == 0 and "user " not in extra_conf else "")
        + extra_conf
    )
    return Server("mosquitto", [binary, "-c", str(conf)], port, workdir)


def redis_server(workdir: Path, *extra: str, port: int | None = None) -> Server:
    binary = find_binary("redis-server", "/usr/bin/redis-server")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        *extra,
    ]
    return Server("redis", argv, port, workdir)
