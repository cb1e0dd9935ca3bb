"""check's server identification on a real loopback server: a vLLM whose ``GET /version`` drops the
connection is still vLLM, with no version (the ``except`` named a module context.py never imported, so
the drop became a NameError in the catch-all)."""

from __future__ import annotations

import socket

from loopback import Loopback, QuietHandler, send
from kimi_deploy.check.client import Clients
from kimi_deploy.check.context import Context


class VllmDroppingVersion(QuietHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/v1/models":
            send(self, 200, {"object": "list", "data": [{"id": "kimi", "object": "model", "owned_by": "vllm"}]})
        elif self.path == "/version":
            self.connection.shutdown(socket.SHUT_RDWR)  # no answer at all
            self.close_connection = True
        else:
            send(self, 404, {"detail": "Not Found"})


def test_a_vllm_whose_version_endpoint_drops_the_connection_is_vllm_without_a_version():
    with Loopback(VllmDroppingVersion) as server:
        clients = Clients.open(server.url, None, 10.0)
        try:
            ctx = Context(clients=clients, profile=None, model=None, expected_model=None, repeat=1)
            assert ctx.identify() == "vllm"
            assert ctx.server_version is None
        finally:
            clients.close()
