"""paramiko's public-key login, one round trip shorter.

paramiko asks sshd for the ssh-userauth service, waits for the answer, and only
then sends the signed login: two round trips before the first channel can open.
sshd handles a connection's messages in order (the service is granted before
the next message is read), so the signed login can follow the request at once;
every connection then logs in one round trip sooner (50 ms on a 50 ms link).

Only where the signature algorithm is the key's own type (ed25519, ecdsa, their
certificates) and the key is a file's, not an ssh-agent's: an RSA key's
algorithm is chosen from the server-sig-algs extension, which may arrive after
the request went out, and an agent may take its time to sign (a confirmation
prompt) or fail, so RSA keys, agent keys and every other method keep
paramiko's order. Whatever goes wrong building the early
login (a key that will not sign, say) leaves the exchange to paramiko, which
then does exactly what it would have done.
"""
from __future__ import annotations

import threading

import paramiko
from paramiko.agent import AgentKey
from paramiko.auth_handler import AuthHandler
from paramiko.common import DEBUG, cMSG_USERAUTH_REQUEST
from paramiko.message import Message
from paramiko.ssh_exception import SSHException


class _LoginWithTheServiceRequest(AuthHandler):
    login_sent_ahead = False

    def _request_auth(self):
        super()._request_auth()
        if self.auth_method != "publickey" or isinstance(self.private_key, AgentKey):
            return
        try:
            key_type, bits = self._get_key_type_and_bits(self.private_key)
            if "rsa" in key_type:
                return
            blob = self._get_session_blob(self.private_key, "ssh-connection", self.username, key_type)
            m = Message()
            m.add_byte(cMSG_USERAUTH_REQUEST)
            m.add_string(self.username)
            m.add_string("ssh-connection")
            m.add_string("publickey")
            m.add_boolean(True)
            m.add_string(key_type)
            m.add_string(bits)
            m.add_string(self.private_key.sign_ssh_data(blob, key_type))
        except Exception:
            return   # paramiko builds it again on the service's answer, and reports what fails
        self.transport._send_message(m)
        self.login_sent_ahead = True

    def _parse_service_accept(self, m):
        if not self.login_sent_ahead:
            return super()._parse_service_accept(m)
        self._log(DEBUG, f"service {m.get_text()!r} accepted; the login went with the request")


class Transport(paramiko.Transport):
    """A paramiko Transport whose public-key login rides with the service request."""

    def auth_publickey(self, username, key, event=None):
        # paramiko's own body, with the handler above
        if (not self.active) or (not self.initial_kex_done):
            raise SSHException("No existing session")
        my_event = event if event is not None else threading.Event()
        self.auth_handler = _LoginWithTheServiceRequest(self)
        self.auth_handler.auth_publickey(username, key, my_event)
        if event is not None:
            return []
        return self.auth_handler.wait_for_response(my_event)


def transport_factory() -> type | None:
    """The Transport for `SSHClient.connect(transport_factory=…)`, or None where this
    paramiko predates the argument (3.2) or lacks the internals used above."""
    connect_args = paramiko.SSHClient.connect.__code__.co_varnames
    needed = ("_request_auth", "_parse_service_accept", "_get_key_type_and_bits", "_get_session_blob")
    if "transport_factory" not in connect_args or not all(hasattr(AuthHandler, n) for n in needed):
        return None
    return Transport
