"""free_ports draws from below the kernel's ephemeral range, where neither a bind to port 0 nor an outgoing
connection's source port can take a chosen port before the server binds it."""

import socket

from rocket.transport import listen


def test_free_ports_are_distinct_bindable_by_servers_and_below_the_ephemeral_range():
    ports = listen.free_ports(12)
    assert len(set(ports)) == 12
    assert all(listen.FREE_PORTS_LOW <= port < listen._ephemeral_low() for port in ports)
    servers = [socket.socket() for _ in ports]
    try:
        for server, port in zip(servers, ports):
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio, asyncio and Go servers do
            server.bind(("127.0.0.1", port))
            server.listen()
    finally:
        for server in servers:
            server.close()


def test_ports_handed_out_are_passed_by_until_their_server_binds():
    """Between free_ports and the server's bind (ten seconds for a node under load), a plain bind, and so another
    free_ports in this or any other process, is refused the port."""
    ports = listen.free_ports(5)
    for port in ports:
        with socket.socket() as plain:
            try:
                plain.bind(("127.0.0.1", port))
            except OSError:
                continue
            raise AssertionError(f"port {port} was handed out, yet a plain bind took it")


def test_a_port_bound_to_zero_is_never_among_them():
    """What the partition test's fault proxies and every client connection take: ports of the ephemeral range."""
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        assert proxy.getsockname()[1] >= listen._ephemeral_low()
        assert proxy.getsockname()[1] not in listen.free_ports(50)


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(listen, "_ephemeral_low", lambda: listen.FREE_PORTS_LOW + 10)
    ports = listen.free_ports(3)
    assert len(set(ports)) == 3 and all(port > 0 for port in ports)
