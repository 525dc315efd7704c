"""A node: reads its config, opens one nursery, starts the roles asked for, and shuts down gracefully.

SIGTERM or SIGINT: stop accepting and reading, let calls in flight finish (bounded), flush, close.
Readiness is printed as one line ("rocket ready ...") and sent to systemd when NOTIFY_SOCKET is set.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket

import trio

from rocket.config import ROLES, NodeConfig
from rocket.errors import Code, RocketError
from rocket.roles.broker import Broker
from rocket.roles.nameserver import TopicRegistry
from rocket.roles.storage import StorageRole
from rocket.transport.http2 import serve_http2
from rocket.transport.rpc import Dispatcher, Lifecycle
from rocket.transport.tcp import serve_tcp

log = logging.getLogger("rocket.node")


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    tcp_port: int
    http2_port: int | None


def _notify_systemd(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.connect(address)
        notify.sendall(message.encode())


async def run_node(config: NodeConfig, *, handle_signals: bool = True, task_status=trio.TASK_STATUS_IGNORED) -> None:
    if set(config.roles) != set(ROLES):
        raise RocketError(
            Code.CONFIG_INVALID,
            f"roles {','.join(config.roles)}: a node runs all roles together until the cluster "
            "(separate broker, storage and nameserver processes) arrives; use --role all",
        )
    config.data_dir.mkdir(parents=True, exist_ok=True)
    registry = TopicRegistry(config.data_dir / "nameserver")
    storage = StorageRole(config)
    dispatcher = Dispatcher()
    Broker(registry, storage.store, config.roles).register(dispatcher)
    lifecycle = Lifecycle()
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_wait_for_signal, stop)
            await nursery.start(storage.serve)
            tcp_port = await nursery.start(serve_tcp, dispatcher, lifecycle, config.listen.host, config.listen.port)
            http2_port = None
            if config.http2_listen is not None:
                listen = config.http2_listen
                http2_port = await nursery.start(serve_http2, dispatcher, lifecycle, listen.host, listen.port)
            ready = Ready(tcp_port, http2_port)
            print(f"rocket ready tcp={config.listen.host}:{tcp_port} http2={http2_port or 'off'} "
                  f"data={config.data_dir} pid={os.getpid()}", flush=True)
            _notify_systemd("READY=1")
            task_status.started(ready)
            await stop.wait()
            log.info("shutting down: draining %d calls in flight", lifecycle.calls_in_flight)
            _notify_systemd("STOPPING=1")
            lifecycle.drain()
            with trio.move_on_after(config.shutdown_grace_s):
                await lifecycle.wait_idle()
            nursery.cancel_scope.cancel()
    finally:
        storage.store.close()
    log.info("stopped")


async def _wait_for_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            stop.set()
            return
