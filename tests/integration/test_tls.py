"""TLS on rocket's TCP port (rocket/transport/tls.py): a dev node that takes TLS only serves the CLI with --tls-ca
and a remoting client over TLS, and tells a plain client why it is refused; a permissive one takes both; SIGHUP
rotates the certificate for new connections while an open long poll goes on; a three-node cluster with tls_ca
talks mutual TLS, and a client or node without a certificate from the cluster's CA can call none of the methods
between nodes, nor join."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trustme

from rocket.client import connect
from rocket.errors import RocketError
from rocket.gateway.remoting.codec import RequestCode
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.listen import free_ports
from rocket.transport.tcp_client import open_tcp_channel
from rocket.transport.tls import client_context
from tests.integration.test_cluster import Node, running
from tests.remoting_client import RemotingClient

NODES = (1, 2, 3)


def issue(ca: trustme.CA, directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, issued by ca, as name.pem (the chain) and name.key."""
    directory.mkdir(parents=True, exist_ok=True)
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = directory / f"{name}.pem", directory / f"{name}.key"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key.write_bytes(cert.private_key_pem.bytes())
    return chain, key


def write_ca(ca: trustme.CA, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ca.cert_pem.bytes())
    return path


def cli(server: str, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocket", *args, "--server", server], check=check,
                          capture_output=True, text=True, timeout=90, env={**os.environ, **(env or {})})


@pytest.fixture
def authority(tmp_path):
    ca = trustme.CA()
    cert, key = issue(ca, tmp_path / "tls", "node")
    return ca, cert, key, write_ca(ca, tmp_path / "tls" / "ca.pem")


def test_enforcing_serves_tls_clients_and_refuses_plain_ones_clearly(server_process, monkeypatch, authority):
    _, cert, key, ca_path = authority
    monkeypatch.setenv("ROCKET_TLS_CERT", str(cert))
    monkeypatch.setenv("ROCKET_TLS_KEY", str(key))
    server = server_process().start()
    tls = ("--tls-ca", str(ca_path))
    cli(server.server, "topic", "create", "orders", "--queues", "2", *tls)
    for index in range(5):
        cli(server.server, "send", "orders", f"m{index}", *tls)
    consumed = cli(server.server, "consume", "orders", "--group", "g", "--from", "earliest", "--count", "5",
                   "--format", "raw", env={"ROCKET_TLS_CA": str(ca_path)})  # the environment's CA, as --tls-ca
    assert sorted(consumed.stdout.split()) == [f"m{index}" for index in range(5)]

    plain = cli(server.server, "send", "orders", "plain", check=False)
    assert plain.returncode == 1 and "UNAUTHENTICATED: this port takes TLS only" in plain.stderr, plain.stderr
    untrusted = cli(server.server, "send", "orders", "x", "--tls", check=False)  # the system's CAs: not ours
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr

    async def names() -> None:
        async with connect(server.server, tls=str(ca_path), tls_server_name="localhost") as channel:
            assert (await channel.call("DescribeTopic", {"topic": "orders"}))["topic"]["name"] == "orders"
        with pytest.raises(RocketError, match="doesn't match|not valid for|mismatch"):
            async with connect(server.server, tls=str(ca_path), tls_server_name="elsewhere.example"):
                pass
    trio.run(names)

    # RocketMQ's remoting protocol on the same port, over TLS: told apart from rocket's frames after decryption.
    remoting = RemotingClient(server.tcp_port)
    remoting.sock = client_context(ca_path).wrap_socket(remoting.sock, server_hostname="127.0.0.1")
    route = remoting.json(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": server.server}
    remoting.close()
    assert "TLS handshake from 127.0.0.1:" in server.log_path.read_text()  # the --tls client, logged, survived
    # HTTP/2 serves the same certificate (no http2_tls_* of its own), ALPN h2.
    context = client_context(ca_path)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", server.http2_port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped:
            assert wrapped.selected_alpn_protocol() == "h2"
    # And HTTP/1.1 (/metrics, probes, the console) is HTTPS with it.
    metrics = subprocess.run(["curl", "-s", "--cacert", str(ca_path), "--max-time", "10",
                              f"https://127.0.0.1:{server.http_port}/metrics"], capture_output=True, text=True)
    assert metrics.returncode == 0 and "rocket_rpc_seconds" in metrics.stdout, metrics
    plain_http = subprocess.run(["curl", "-s", "--max-time", "10", f"http://127.0.0.1:{server.http_port}/healthz"],
                                capture_output=True, text=True)
    assert plain_http.returncode != 0 or "ok" not in plain_http.stdout, plain_http
    cli(server.server, "topic", "list", *tls)  # the listener still serves


def test_permissive_takes_plain_and_tls(server_process, monkeypatch, authority):
    _, cert, key, ca_path = authority
    monkeypatch.setenv("ROCKET_TLS_CERT", str(cert))
    monkeypatch.setenv("ROCKET_TLS_KEY", str(key))
    monkeypatch.setenv("ROCKET_TLS_MODE", "permissive")
    server = server_process().start()
    cli(server.server, "topic", "create", "t", "--queues", "1")
    cli(server.server, "send", "t", "plain")
    cli(server.server, "send", "t", "tls", "--tls-ca", str(ca_path))
    consumed = cli(server.server, "consume", "t", "--group", "g", "--from", "earliest", "--count", "2", "--format",
                   "raw", "--tls-ca", str(ca_path))
    assert consumed.stdout.split() == ["plain", "tls"]
    remoting = RemotingClient(server.tcp_port)  # plain remoting, still sniffed by its first bytes
    assert remoting.json(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})["queueDatas"]
    remoting.close()


def served_certificate(port: int, ca_path: Path) -> bytes:
    """The certificate a new TLS connection to port gets, in DER."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with client_context(ca_path).wrap_socket(raw, server_hostname="127.0.0.1") as wrapped:
            return wrapped.getpeercert(binary_form=True)


def test_sighup_rotates_the_certificate_for_new_connections_and_keeps_open_ones(server_process, monkeypatch,
                                                                              authority, tmp_path):
    old_ca, cert, key, old_ca_path = authority
    new_ca = trustme.CA()
    both = tmp_path / "tls" / "both.pem"  # a client that trusts the old and the new CA, through the rotation
    both.write_bytes(old_ca.cert_pem.bytes() + new_ca.cert_pem.bytes())
    new_ca_path = write_ca(new_ca, tmp_path / "tls" / "new-ca.pem")
    monkeypatch.setenv("ROCKET_TLS_CERT", str(cert))
    monkeypatch.setenv("ROCKET_TLS_KEY", str(key))
    server = server_process().start()
    cli(server.server, "topic", "create", "t", "--queues", "1", "--tls-ca", str(both))
    before = served_certificate(server.tcp_port, old_ca_path)
    rotated: list[bytes] = []

    async def rotate_under_a_long_poll() -> None:
        async with connect(server.server, tls=str(old_ca_path)) as opened_before:
            async with trio.open_nursery() as nursery:
                got: list[Message] = []

                async def long_poll() -> None:
                    response = await opened_before.call(
                        "Pull", {"topic": "t", "queues": [{"queue": 0, "offset": 0}], "wait_ms": 30_000},
                        timeout_s=60)
                    for stored in response["batches"]:
                        got.extend(batch_codec.decode(stored["batch"], stored["base_offset"], 0))
                nursery.start_soon(long_poll)
                await trio.sleep(0.5)
                issue(new_ca, tmp_path / "tls", "node")  # the same paths, new files
                server.process.send_signal(signal.SIGHUP)
                with trio.fail_after(10):
                    while "TLS reloaded" not in server.log_path.read_text():
                        await trio.sleep(0.05)
                after = await trio.to_thread.run_sync(served_certificate, server.tcp_port, new_ca_path)
                assert after != before
                rotated.append(after)
                with pytest.raises(ssl.SSLCertVerificationError):  # the old CA does not vouch for the new one
                    await trio.to_thread.run_sync(served_certificate, server.tcp_port, old_ca_path)
                async with connect(server.server, tls=str(new_ca_path)) as opened_after:
                    batch = batch_codec.encode([Message(b"after the rotation")], int(time.time() * 1000))
                    await opened_after.call("Produce", {"topic": "t", "queue": 0, "batch": batch})
            assert [message.body for message in got] == [b"after the rotation"]
            # The connection opened before the rotation still serves calls.
            assert (await opened_before.call("DescribeTopic", {"topic": "t"}))["topic"]["name"] == "t"

    trio.run(rotate_under_a_long_poll)

    # A certificate file that does not load is logged, and the node keeps the one it has.
    cert.write_text("not a certificate\n")
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "TLS reload failed" not in server.log_path.read_text():
        assert time.monotonic() < deadline, server.log_path.read_text()[-2000:]
        time.sleep(0.05)
    assert served_certificate(server.tcp_port, new_ca_path) == rotated[0]
    cli(server.server, "send", "t", "still served", "--tls-ca", str(new_ca_path))
    assert server.process.poll() is None


@pytest.fixture
def mutual(tmp_path, authority):
    ca, cert, key, ca_path = authority
    ports = free_ports(len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    environment = {"ROCKET_STORAGE_GROUPS": "4", "ROCKET_REPLICATION": "3", "ROCKET_TLS_CERT": str(cert),
                   "ROCKET_TLS_KEY": str(key), "ROCKET_TLS_CA": str(ca_path)}
    nodes = {node: Node(node, port, nameservers, tmp_path, environment=environment)
             for node, port in zip(NODES, ports)}
    with running(nodes):
        yield nodes, ca_path, nameservers


async def refused(channel, method: str, request: dict) -> None:
    with pytest.raises(RocketError) as error:
        await channel.call(method, request)
    assert error.value.code.name == "UNAUTHENTICATED", (method, error.value)


HEARTBEAT = {"node": 9, "address": "127.0.0.1:1", "roles": ["storage"],
             "load": {"groups": 0, "leads": [], "bytes": 0, "free_disk_bytes": 0, "lagging": []}}


def test_a_cluster_talks_mutual_tls_and_nodes_without_its_certificates_are_refused(mutual, tmp_path):
    nodes, ca_path, nameservers = mutual
    tls = ("--tls-ca", str(ca_path))
    cli(nodes[1].server, "topic", "create", "orders", "--queues", "4", *tls)  # metadata Raft over mutual TLS links
    for index in range(9):
        cli(nodes[1 + index % 3].server, "send", "orders", f"m{index}", *tls)  # brokers call storage nodes
    consumed = cli(nodes[2].server, "consume", "orders", "--group", "g", "--from", "earliest", "--count", "9",
                   "--format", "raw", *tls)
    assert sorted(consumed.stdout.split()) == sorted(f"m{index}" for index in range(9))

    other_ca = trustme.CA()
    other_cert, other_key = issue(other_ca, tmp_path / "other", "node")

    async def outsiders() -> None:
        # A client without a certificate: served, but not as a node.
        async with connect(nodes[1].server, tls=str(ca_path)) as channel:
            assert (await channel.call("DescribeTopic", {"topic": "orders"}))["topic"]["name"] == "orders"
            await refused(channel, "RaftStep", {"sender": 2, "payload": b"\x00" * 16})
            await refused(channel, "NodeHeartbeat", HEARTBEAT)
            await refused(channel, "MetaCreateTopic", {"topic": "sneaky", "queues": 1})
        # A certificate from another CA: the handshake itself fails, so nothing is called.
        foreign = client_context(ca_path, other_cert, other_key)
        for method, request in (("RaftStep", {"sender": 2, "payload": b"\x00" * 16}), ("NodeHeartbeat", HEARTBEAT)):
            with pytest.raises(RocketError, match="UNAVAILABLE|CONNECTION_LOST"):
                async with connect(nodes[2].server, tls=foreign) as channel:
                    await channel.call(method, request)
        # The cluster's own certificate: a node, which may (a valid heartbeat of an unknown node is answered).
        own = client_context(ca_path, *(Path(nodes[1].environment[key]) for key in ("ROCKET_TLS_CERT",
                                                                                     "ROCKET_TLS_KEY")))
        async with connect(nodes[3].server, tls=own) as channel:
            assert (await channel.call("GetRoute", {"topic": "orders"}))["topic"]["name"] == "orders"

    trio.run(outsiders)

    # A node with a certificate from another CA cannot join: its heartbeats and Raft links never get through.
    rogue = Node(4, free_ports(1)[0], nameservers, tmp_path, roles="storage", environment={
        "ROCKET_STORAGE_GROUPS": "4", "ROCKET_REPLICATION": "3", "ROCKET_TLS_CERT": str(other_cert),
        "ROCKET_TLS_KEY": str(other_key), "ROCKET_TLS_CA": str(write_ca(other_ca, tmp_path / "other" / "ca.pem"))})
    rogue.start()
    try:
        deadline = time.monotonic() + 30
        while "heartbeat to the nameservers failed" not in rogue.log_path.read_text():
            assert time.monotonic() < deadline and rogue.process.poll() is None, rogue.log_path.read_text()[-2000:]
            time.sleep(0.2)
        assert "TLS handshake" in rogue.log_path.read_text()
        assert rogue.ready_lines() == 0  # never assigned: the nameservers never heard of it
        status = cli(nodes[1].server, "cluster", "status", *tls).stdout
        assert f"127.0.0.1:{rogue.port}" not in status
        served = "".join(node.log_path.read_text() for node in nodes.values())
        assert "TLS handshake from 127.0.0.1:" in served  # refused where it knocked, and logged
    finally:
        rogue.kill()
    assert all(node.exited_by_itself() is None for node in nodes.values())


def test_a_permissive_node_falls_back_to_plain_to_a_node_without_tls(server_process, authority):
    """A cluster moving to TLS: a node restarted in permissive mode still reaches one that speaks no TLS yet."""
    _, _, _, ca_path = authority
    server = server_process().start()  # plain
    context = client_context(ca_path)

    async def reach() -> None:
        with pytest.raises(RocketError, match="the server may not speak TLS"):
            async with open_tcp_channel("127.0.0.1", server.tcp_port, tls=context):
                pass
        async with open_tcp_channel("127.0.0.1", server.tcp_port, tls=context, plain_fallback=True) as channel:
            assert "topics" in await channel.call("ListTopics", {})
    trio.run(reach)
