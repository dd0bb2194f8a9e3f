"""A garbled SSH handshake is tried again, then said in one line."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from glue.errors import GlueError
from glue.infra import ssh
from glue.infra.inventory import Host


def _server(reply: bytes, close_at_once: bool = False) -> tuple[socket.socket, list[int]]:
    """A loopback server that answers each connection with `reply`, then keeps it open a while (or closes it)."""
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            seen.append(1)
            conn.sendall(reply)
            if close_at_once:
                # End of stream for the client (FIN), then read what it sent until it hangs up: a close with
                # its bytes unread would reset the connection instead, which may reach the client before it read
                # the banner (then a banner error, not the cut-off handshake this test is about).
                conn.shutdown(socket.SHUT_WR)
                threading.Thread(target=_drain, args=(conn,), daemon=True).start()
            else:
                threading.Timer(3, conn.close).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, seen


def _drain(conn: socket.socket) -> None:
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    conn.close()


def _host(port: int) -> Host:
    return Host(name="vm-x", id="vm-x-1", ssh_host="127.0.0.1", ssh_port=port, ssh_user="root", host_key="",
                gpu_type="none", gpu_count=0, backend="local")


def test_a_garbled_handshake_is_tried_three_times_then_said_in_one_line(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A banner, then bytes that are no SSH packet: paramiko's handshake fails mid-way.
    srv, seen = _server(b"SSH-2.0-OpenSSH_9.2\r\n" + b"\x00\x00\x00\x07garbage!" * 8)
    monkeypatch.setattr(ssh, "known_hosts_path", lambda home: tmp_path / "known_hosts")
    monkeypatch.setattr(ssh, "client_key", lambda home: tmp_path / "id_ed25519")
    (tmp_path / "known_hosts").write_text("")
    try:
        with pytest.raises(GlueError, match=r"^vm-x: SSH failed: ") as err:
            ssh.connect(tmp_path, _host(srv.getsockname()[1]), timeout=2)
        assert "\n" not in str(err.value)
        assert len(seen) == ssh.HANDSHAKE_TRIES == 3
    finally:
        srv.close()


def test_a_handshake_cut_off_is_tried_again_then_said_in_one_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A banner, then the connection closed (as sshd drops one past MaxStartups): paramiko raises EOFError,
    which must not escape as a bare interrupt ("Aborted!")."""
    srv, seen = _server(b"SSH-2.0-OpenSSH_9.2\r\n", close_at_once=True)
    monkeypatch.setattr(ssh, "known_hosts_path", lambda home: tmp_path / "known_hosts")
    monkeypatch.setattr(ssh, "client_key", lambda home: tmp_path / "id_ed25519")
    (tmp_path / "known_hosts").write_text("")
    try:
        with pytest.raises(GlueError, match=r"^vm-x: SSH failed: the server closed the connection during the "
                                            r"handshake$"):
            ssh.connect(tmp_path, _host(srv.getsockname()[1]), timeout=2)
        assert len(seen) == ssh.HANDSHAKE_TRIES
    finally:
        srv.close()
