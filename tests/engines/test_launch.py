"""The rendezvous's idle timeout, its Ctrl-C, and the choice of gloo's interface."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from slate.engines.distributed.control import launch
from slate.engines.distributed.control.launch import choose_gloo_interface, serve_rendezvous
from slate.engines.distributed.control.liveness import Heartbeat
from slate.engines.distributed.control.store_records import Records
from slate.errors import ConfigError
from tests.sites import free_port


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_rendezvous_exits_once_no_heartbeat_has_moved_for_the_idle_timeout():
    import datetime

    import torch.distributed as dist

    port = _free_port()
    lines: list[str] = []
    result: list[int] = []
    server = threading.Thread(
        target=lambda: result.append(
            serve_rendezvous(port, "127.0.0.1", lines.append, idle_timeout=2.0)
        )
    )
    started = time.monotonic()
    server.start()
    time.sleep(0.5)
    client = dist.TCPStore("127.0.0.1", port, is_master=False,
                           timeout=datetime.timedelta(seconds=10))  # fmt: skip
    beat = Heartbeat(lambda: client, 0, Records(None, 1))  # a party beating keeps it alive ...
    time.sleep(3.0)
    assert server.is_alive()
    beat.stop()  # ... and once it falls silent the rendezvous gives up
    server.join(timeout=10)
    assert not server.is_alive() and result == [1]
    assert time.monotonic() - started >= 5.0
    assert "--idle-timeout" in lines[-1] and "--resume" in lines[-1]


ADDRESSES = {"lo": "127.0.0.1", "eth0": "10.0.0.7"}


@pytest.fixture
def route(monkeypatch):
    monkeypatch.setattr(launch, "route_source", lambda host, port: "10.0.0.7")


def test_an_unset_interface_is_set_to_the_route_to_the_rendezvous(route):
    env: dict[str, str] = {}
    note = choose_gloo_interface("10.0.0.1", 29500, env, ADDRESSES)
    assert env == {"GLOO_SOCKET_IFNAME": "eth0"} and "eth0 (10.0.0.7)" in note


def test_a_loopback_or_unknown_interface_is_refused_naming_the_right_one(route):
    with pytest.raises(ConfigError, match=r"loopback interface .* leaves through eth0"):
        choose_gloo_interface("10.0.0.1", 29500, {"GLOO_SOCKET_IFNAME": "lo"}, ADDRESSES)
    with pytest.raises(ConfigError, match=r"names no interface .* leaves through eth0"):
        choose_gloo_interface("10.0.0.1", 29500, {"GLOO_SOCKET_IFNAME": "wlan9"}, ADDRESSES)
    env = {"GLOO_SOCKET_IFNAME": "eth0"}
    assert choose_gloo_interface("10.0.0.1", 29500, env, ADDRESSES) is None
    assert env == {"GLOO_SOCKET_IFNAME": "eth0"}


@pytest.mark.processes
def test_ctrl_c_stops_a_rendezvous_that_inherited_sigint_ignored():
    """Started by a script with ``&`` (or by a runner that ignores SIGINT), ``slate rendezvous``
    inherits SIGINT ignored; a SIGINT still stops it at once, with its own line and code 130."""
    ignore_then_run = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, '-m', 'slate', *sys.argv[1:]])"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", ignore_then_run, "rendezvous", "--port", str(free_port()),
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "serving one run" in server.stdout.readline()  # it listens: send the signal
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 130, err
    assert "slate rendezvous: stopped." in out and "Traceback" not in err
