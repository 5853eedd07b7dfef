"""A site's ``--timeout`` holds at the door: a rendezvous address held by a server of another
protocol, or one where nothing listens, ends the site within ``--timeout`` + 10 s with one
paragraph that names the address and what was found there, and no traceback."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sites import finish, free_port, start_party

TIMEOUT_S = 8  # the sites' --timeout where nothing listens
# At an HTTP server the site used to wait without end, which any --timeout shows; a short one
# makes the wait short. (Where nothing listens, torch's own retry took about twice --timeout:
# 8 s keeps that well above the bound below.)
HTTP_TIMEOUT_S = 3
# (a site's interpreter start and its imports count in the time measured)
SLACK_S = 10
BOUND_S = TIMEOUT_S + SLACK_S


def _tiny_site(root: Path) -> None:
    """Site 1's own (tiny) files: it never reads them, since it never gets past the door."""
    (root / "site1").mkdir(parents=True)
    for name in ("train.svm", "test.svm"):
        (root / "site1" / name).write_text("1 1:0.5 2:1\n-1 2:0.25\n1 3:1\n-1 1:1\n")


def _site_at(root: Path, port: int, timeout: int = TIMEOUT_S) -> tuple[int, str, float]:
    """Start site 1 of 2 against ``127.0.0.1:port`` with ``--timeout timeout``: its exit code,
    its output, and how long it ran."""
    _tiny_site(root)
    flags = ["--engine", "distributed", "--nodes", "2", "--train", "train.svm", "--test",
             "test.svm", "--dataset", "libsvm", "--features", "3", "--out", "run",
             "--no-progress", "--no-plots", "--timeout", str(timeout)]  # fmt: skip
    started = time.monotonic()
    party = start_party(root, 1, port, *flags)
    [(code, said)] = finish([party], timeout=timeout + SLACK_S + 30)
    return code, said, time.monotonic() - started


def _one_paragraph(said: str) -> str:
    text = said.strip()
    assert "\n" not in text and "Traceback" not in text, text
    return text


@contextlib.contextmanager
def _http_server() -> Iterator[int]:
    """A plain HTTP server (``python -m http.server``'s) on a loopback port, on a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.processes
def test_a_site_at_an_http_server_is_told_it_is_not_a_rendezvous(tmp_path):
    with _http_server() as port:  # (listening once constructed)
        code, said, took = _site_at(tmp_path, port, HTTP_TIMEOUT_S)
    text = _one_paragraph(said)
    assert code == 2 and took <= HTTP_TIMEOUT_S + SLACK_S, (code, took, text)
    assert text.startswith(
        f"slate: error: Party 1 could not reach the rendezvous store at 127.0.0.1:{port} within "
        f"--timeout {HTTP_TIMEOUT_S} s: something is listening there, but it does not speak the "
        "rendezvous protocol (torch.distributed's TCPStore)"
    ), text
    assert "Check the port: another program (a web server, say) may hold it" in text


@pytest.mark.processes
def test_a_site_where_nothing_listens_ends_within_its_timeout(tmp_path):
    port = free_port()  # (closed again: nothing listens there)
    code, said, took = _site_at(tmp_path, port)
    text = _one_paragraph(said)
    assert code == 2 and took <= BOUND_S, (code, took, text)
    assert text.startswith(
        f"slate: error: Party 1 could not reach the rendezvous store at 127.0.0.1:{port} within "
        f"--timeout {TIMEOUT_S} s: nothing is listening there (the last attempt: Connection "
        "refused). Check that the rendezvous is running and that the address is right"
    ), text
    assert f"run 'slate rendezvous --port {port}' on 127.0.0.1" in text


def test_a_server_that_answers_garbage_is_given_up_at_the_deadline():
    """In this process: a server that accepts, sends bytes of no protocol and hangs up."""
    from slate.engines.distributed.control.store_door import join_store
    from slate.errors import ConfigError

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage() -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = listener.accept()
                with peer:
                    peer.sendall(b"\x00garbage\xff" * 8)

    threading.Thread(target=answer_garbage, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError, match="does not speak the rendezvous protocol"):
            join_store("127.0.0.1", port, 2.0, 3, f"127.0.0.1:{port}")
    finally:
        listener.close()
    assert time.monotonic() - started <= 2.0 + 3.0
