"""A loopback TCP server for tests of what is dialled: its behaviour with each client is given."""
from __future__ import annotations

import socket
import threading


class Listener:
    """A TCP server on 127.0.0.1 that does `behaviour(conn)` with each client."""

    def __init__(self, behaviour):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns = []
        self.behaviour = behaviour
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            threading.Thread(target=self.behaviour, args=(conn,), daemon=True).start()

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def refusing_ssh_server(host_key) -> Listener:
    """A real SSH server (paramiko's) that shows `host_key` and refuses every login: a client gets
    as far as the host key check and the authentication."""
    import time

    import paramiko

    class RefuseAll(paramiko.ServerInterface):
        def get_allowed_auths(self, username):
            return "publickey"

        def check_auth_publickey(self, username, key):
            return paramiko.AUTH_FAILED

    def serve(conn):
        t = paramiko.Transport(conn)
        t.add_server_key(host_key)
        try:
            t.start_server(server=RefuseAll())
            t.accept(3)
        except Exception:  # noqa: BLE001 - the client's failures end the session
            pass
        finally:
            time.sleep(0.5)
            t.close()
    return Listener(serve)
