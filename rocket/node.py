"""A node: reads its config, opens one nursery, starts the roles asked for (build_roles, the one place they are wired),
holds its data directory's lock, opens the listeners, and shuts down gracefully (run_node). Dev mode (all roles, no
nameservers configured) is a cluster of one node.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import gc
import logging
import os
import shutil
import signal
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import cast

import prometheus_client
import trio

from rocket import limits
from rocket.access import Access, cluster_key
from rocket.quotas import Quotas
from rocket.clock import Clock
from rocket.config import ConfigError, NodeConfig
from rocket.disk import peer_versions
from rocket.disk.files import says_out_of_space
from rocket.errors import Code, RocketError, collapse_single_error, leaf_exceptions
from rocket.gateway.console import Console
from rocket.gateway.mqtt.server import MqttGateway
from rocket.gateway.remoting import RemotingGateway, looks_like_remoting
from rocket.gateway.rocketmq import rocketmq_services
from rocket.model import Address
from rocket.raft.host import RaftHost
from rocket.raft.wal import Wal
from rocket.roles.broker import Broker
from rocket.roles.controller import ControllerRole
from rocket.roles.nameserver import Nameserver
from rocket.roles.peers import Peers
from rocket.roles.storage import StorageRole
from rocket.telemetry.registry import Telemetry
from rocket.telemetry.runner import raft_metrics, run_telemetry, traffic_metrics
from rocket.telemetry.ship import KEY_PREFIX_DEFAULT
from rocket.telemetry.spool import Spool
from rocket.tier.local import LocalDirectoryStore
from rocket.tier.objectstore import ObjectStore
from rocket.transport.h2_server import serve_http2
from rocket.transport.links import PeerLinks
from rocket.transport.listen import cancel_on
from rocket.transport.pool import ChannelPool
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher
from rocket.transport.http1 import serve_http1
from rocket.transport.peer_auth import PeerAuth
from rocket.transport.tcp import serve_tcp
from rocket.transport.tls import NodeTls
from rocket.world import WORLD, World

log = logging.getLogger("rocket.node")


LOCK_FILE = "node.lock"  # in the data directory: held (flock) while a node runs on it


class StartupError(Exception):
    """The node cannot start: a port in use, a data directory another node holds. One line for its operator."""


def stop_reason(error: BaseException) -> str | None:
    """One line for an error the node stopped on that its operator can act on, else None: the data disk full, as
    the store's LevelDB says it (one that failed to write refuses every write after, until it is opened again), in
    every task that met it at once (a group of them, each saying so)."""
    leaves = list(leaf_exceptions(error))
    if not all(says_out_of_space(leaf) for leaf in leaves):
        return None
    said = leaves[0].args[0] if len(leaves[0].args) == 1 else leaves[0]
    said = said.decode(errors="replace") if isinstance(said, bytes) else said  # plyvel's errors carry LevelDB's bytes
    return f"stopped: the data disk is full ({said}); start the node again once space is freed"


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    tcp_port: int
    http2_port: int | None
    http_port: int | None = None
    mqtt_port: int | None = None


def keep_freed_memory(pretouch_bytes: int = limits.malloc_pretouch_bytes) -> bool:
    """Have glibc's malloc serve big blocks (a 1 MiB batch, a read) from its heap, and keep freed heap memory,
    instead of mapping fresh pages for each block and unmapping them once freed. A fresh page costs a fault
    on first touch, and on a VM that hands free memory back to its host a host fault too: produce of 1 GB ran
    1.2x faster with warm pages (benchmarks/RESULTS.md, "Direct I/O, warm memory and a pipelined round loop").
    Then touch pretouch_bytes of that heap once and free it, as RocketMQ's system guide has its
    broker pre-touch the Java heap (-XX:+AlwaysPreTouch): until the heap has grown to its working size, each new
    1 MiB block faults again (0.6 ms of the trio thread per produce batch, against 0.07 ms in warm pages;
    RESULTS.md, "A heap touched at start"). `rocket run` touches it after the ready line instead (touch_heap).
    Process-wide; False where the C library has no mallopt (macOS) or refuses the values."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    if not (mallopt(m_mmap_threshold, limits.malloc_mmap_threshold_bytes)
            and mallopt(m_trim_threshold, limits.malloc_trim_threshold_bytes)):
        return False
    blocks = [b"\x01" * limits.MiB for _ in range(pretouch_bytes // limits.MiB)]
    del blocks
    return True


def tune_collector() -> None:
    """Set CPython's cyclic collector for a server's heap, process-wide: young collections only once
    limits.gc_young_objects more container objects live than at the last one, so that the objects of a round or a
    request are freed by their counts before a collection looks at them, not promoted to older generations whose
    collections then walk them (benchmarks/RESULTS.md, "The request path and the collector"). `rocket run` freezes
    what the start-up made once the node is ready (gc.freeze, freeze_startup): full collections no longer walk it."""
    gc.set_threshold(limits.gc_young_objects, limits.gc_older_collections, limits.gc_older_collections)


async def touch_heap(total_bytes: int) -> None:
    """keep_freed_memory's touch of the heap, done once the node serves: in slices, between which requests run, so
    that it delays the first ones by one slice at most instead of delaying the ready line by all of it (60 ms of
    a restart). In the trio thread, whose malloc arena (the main one) the requests' blocks come from."""
    blocks: list[bytes] = []
    while len(blocks) * limits.MiB < total_bytes:
        blocks.extend(b"\x01" * limits.MiB for _ in range(limits.malloc_pretouch_slice_bytes // limits.MiB))
        await trio.sleep(0)
    del blocks


def _notify_systemd(message: str) -> None:
    """sd_notify(3): one datagram to NOTIFY_SOCKET when systemd set it (`@` names an abstract socket). A socket that
    cannot be reached is logged, never fatal: the node serves whether or not its supervisor listens."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.connect(address)
            notify.sendall(message.encode())
    except OSError as error:
        log.warning("systemd's NOTIFY_SOCKET %s did not take %s: %s", address.replace("\0", "@"), message, error)


def watchdog_interval_s() -> float | None:
    """How often to send WATCHDOG=1: half of what the unit's WatchdogSec= set (WATCHDOG_USEC), as
    sd_watchdog_enabled(3) advises. None without a watchdog, or when WATCHDOG_PID names another process."""
    pid = os.environ.get("WATCHDOG_PID")
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return None
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2e6


async def _keep_watchdog(interval_s: float) -> None:
    """WATCHDOG=1 while the event loop turns: a loop wedged in a blocking call stops the pings, and systemd kills and
    restarts the node (Restart=on-failure)."""
    while True:
        _notify_systemd("WATCHDOG=1")
        await trio.sleep(interval_s)


@contextlib.asynccontextmanager
async def open_tier(config: NodeConfig):
    """The node's object store (None with tier_backend off): a storage node offloads to it, and every node ships
    its telemetry to it. S3 runs aiobotocore on asyncio inside this Trio process through trio-asyncio."""
    if config.tier_backend == "off":
        yield None
    elif config.tier_backend == "local":
        config.data_dir.mkdir(parents=True, exist_ok=True)
        async with LocalDirectoryStore(config.tier_directory or config.data_dir / "tier") as store:
            yield store
    else:
        from rocket.tier.retries import asyncio_loop

        async with asyncio_loop():
            async with _open_remote_tier(config) as store:
                yield store


def _open_remote_tier(config: NodeConfig):
    """The remote object store config.tier_backend names. tier_s3_prefix starts the keys of S3's pieces (see
    rocket/serde/piece.py); the Azure and GCS stores add their prefix to every key themselves, and HDFS keeps them
    under its root directory. Azure, GCS and HDFS need their extras (pip install 'rocket[azure]', and so on)."""
    try:
        if config.tier_backend == "azure":
            from rocket.tier.azure import open_azure_store
            connection_string = os.environ.get("AZURE_STORAGE_CONNECTION_STRING") or None
            account, key = os.environ.get("AZURE_STORAGE_ACCOUNT"), os.environ.get("AZURE_STORAGE_KEY")
            credential = {"account_name": account, "account_key": key} if account and key else None
            return open_azure_store(config.tier_azure_container, connection_string=connection_string,
                                    account_url=None if connection_string else config.tier_azure_account_url,
                                    credential=credential, prefix=_slashed(config.tier_azure_prefix))
        if config.tier_backend == "gcs":
            from rocket.tier.gcs import open_gcs_store
            return open_gcs_store(config.tier_gcs_bucket, endpoint_url=config.tier_gcs_endpoint or None,
                                  service_file=config.tier_gcs_service_file or None,
                                  anonymous=bool(config.tier_gcs_endpoint) and not config.tier_gcs_service_file,
                                  prefix=_slashed(config.tier_gcs_prefix))
        if config.tier_backend == "hdfs":
            from rocket.tier.hdfs import open_hdfs_store
            return open_hdfs_store(config.tier_hdfs_url, root=config.tier_hdfs_root, user=config.tier_hdfs_user or None)
    except ImportError as error:
        raise ConfigError(f"tier_backend = {config.tier_backend} needs its client library: pip install "
                          f"'rocket[{config.tier_backend}]' ({error})") from None
    from rocket.tier.s3 import open_s3_store
    return open_s3_store(config.tier_s3_bucket, endpoint_url=config.tier_s3_endpoint or None,
                         region=config.tier_s3_region, path_style=config.tier_s3_path_style)


def _slashed(prefix: str) -> str:
    return prefix + "/" if prefix else ""


async def run_node(config: NodeConfig, *, handle_signals: bool = True, pretouch_bytes: int = 0,
                   freeze_startup: bool = False, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the node until told to stop; once it is ready, touch pretouch_bytes of the heap (touch_heap), and with
    freeze_startup (a process that runs one node: `rocket run`) move what the start-up made out of the collector's
    sight (gc.freeze).

    SIGTERM or SIGINT: stop accepting and reading, let calls in flight finish (bounded), flush, close. SIGHUP: re-read
    the TLS certificate, key and CA files for new connections (transport/tls.py). Readiness is printed as one line
    ("rocket ready ...") and sent to systemd when NOTIFY_SOCKET is set (READY=1, then STOPPING=1 when it drains, and
    WATCHDOG=1 at half the unit's WatchdogSec= if it set one). After that line, `rocket run` touches the heap
    (touch_heap, limits.malloc_pretouch_bytes), in slices between requests, and freezes what the start-up made out of
    the cyclic collector's sight (tune_collector)."""
    created = not config.data_dir.exists()
    ready = trio.Event()
    try:
        with _lock_data_directory(config.data_dir):
            async with open_tier(config) as objects:
                await _run_node(config, objects, handle_signals, task_status, ready, pretouch_bytes, freeze_startup)
    except BaseException:
        # A node that failed before it served holds nothing anyone was told is stored: leave no directory behind
        # that a retry (with another port, say) would then take for this node's.
        if created and not ready.is_set():
            shutil.rmtree(config.data_dir, ignore_errors=True)
        raise


@contextlib.contextmanager
def _lock_data_directory(data_dir):
    """Hold the data directory for this node alone: a second node on it would write the same WAL."""
    data_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
            raise StartupError(f"data directory {data_dir} is in use by another rocket node (pid {holder}): stop "
                               "that node, or give this one another --data-dir") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)


async def _listen(start, what: str, address: Address) -> int:
    """Start a listener; a port that cannot be bound is a StartupError naming the address and its option."""
    try:
        with collapse_single_error():
            return await start()
    except OSError as error:
        raise StartupError(f"cannot listen on {address} ({what}): {error.strerror or error}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Roles:
    """The roles of one node, as build_roles wired them (None: a role the node does not run)."""

    host: RaftHost
    peers: Peers
    nameserver: Nameserver | None
    storage: StorageRole | None
    broker: Broker | None
    controller: ControllerRole | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the Raft host and the roles' services in nursery; a node without storage reports its load itself
        (a standalone controller only to the nameservers it is given). Returns once they run (a storage node then
        waits for its assignment: see StorageRole.assigned)."""
        await nursery.start(self.host.run)
        if self.controller is not None:
            await nursery.start(self.controller.serve)
        if self.nameserver is not None:
            await nursery.start(self.nameserver.serve)
        if self.broker is not None:
            await nursery.start(self.broker.run)
        if self.storage is not None:
            await nursery.start(self.storage.serve)
        elif self.peers.config.roles != ("controller",) or self.peers.config.nameservers:
            await nursery.start(self.peers.report_forever)


def build_roles(config: NodeConfig, host: RaftHost, peers: Peers, dispatcher: Dispatcher, clock: Clock,
                addresses: dict[int, tuple[str, int]], objects: ObjectStore | None = None,
                world: World = WORLD) -> Roles:
    """Make the roles config asks for over this node's Raft host and peers, reading clock, and register their
    methods (and RaftStep and RaftSnapshotChunk, into host) with dispatcher. The one place roles are wired: node.py
    and the roles simulator (tests/sim/roles_sim.py) both call it; what differs between them (network, disk, clock,
    world: the machine's threads, free space and randomness) comes in as arguments. Every node runs one multi-raft
    host: the nameservers' metadata group if it is a nameserver, the controllers' group if it is a standalone
    controller, and the storage groups assigned to it if it stores.
    Roles reach each other through Peers: over TCP, or directly when they share the process."""
    async def raft_step(request: dict) -> dict:
        host.receive(request["payload"])
        return {}

    async def raft_snapshot_chunk(request: dict) -> dict:
        return {"data": await host.snapshot_chunk(request["group"], request["name"], request["offset"])}

    async def fetch_snapshot_chunk(node: int, group: int, name: str, offset: int) -> bytes:
        """A follower's fetch of its leader's snapshot file, over the peers' pooled channels."""
        if node not in addresses:
            raise RocketError(Code.UNAVAILABLE, f"the address of node {node} is not known yet")
        request = {"group": group, "name": name, "offset": offset}
        return (await peers.call(Address(*addresses[node]), "RaftSnapshotChunk", request))["data"]

    dispatcher.handle("RaftStep", raft_step)
    dispatcher.handle("RaftSnapshotChunk", raft_snapshot_chunk)
    host.fetch_snapshot_chunk = fetch_snapshot_chunk
    nameserver = Nameserver(config, host, peers, clock, objects=objects) if "nameserver" in config.roles else None
    storage = StorageRole(config, host, peers, addresses, clock, objects, world) if "storage" in config.roles else None
    broker = Broker(peers, config.roles, clock, world) if "broker" in config.roles else None
    controller = ControllerRole(config, host, peers, clock) if "controller" in config.roles else None
    if controller is not None:
        controller.register(dispatcher)
    if nameserver is not None:
        nameserver.register(dispatcher)
    if storage is not None:
        storage.register(dispatcher)
    if broker is not None:
        broker.register(dispatcher, forward_status=nameserver is None)
    return Roles(host, peers, nameserver, storage, broker, controller)


def _peer_auth(config: NodeConfig, dispatcher: Dispatcher, clock: Clock, tls: NodeTls) -> PeerAuth | None:
    """With a cluster secret, the methods between nodes answer only connections that said PeerHello with it; with
    tls_ca (and tls_mode enforcing), only connections whose client certificate verified against it (or, with a
    secret too, that said PeerHello)."""
    dispatcher.guard.peers_only = bool(config.cluster_secret) or (tls.verifies_peers and not tls.plain_accepted)
    if not config.cluster_secret:
        if config.nameservers and not dispatcher.guard.peers_only:
            log.warning("no cluster_secret and no tls_ca (with tls_mode enforcing): the methods between nodes answer "
                        "anyone who reaches this node's TCP port")
        return None
    dispatcher.guard.peer_auth = PeerAuth(config.cluster_secret.encode(), config.node_id, clock.wall_ms)
    return dispatcher.guard.peer_auth


def _access(config: NodeConfig, dispatcher: Dispatcher, clock: Clock) -> Access | None:
    """With auth on, every call from the wire needs a signed-in user whom the policies allow."""
    if not config.auth:
        return None
    dispatcher.guard.access = Access(cluster_key(config.cluster_secret), clock.wall_ms, clock.now_s)
    return dispatcher.guard.access


async def _follow_acl(access: Access | None, quotas: Quotas | None, peers: Peers, loaded: trio.Event) -> None:
    """Keep the node's users, policies (with auth on) and client quotas (on brokers) those of the metadata; loaded is
    set once they arrived, with auth on once with a user (the first user is made at a cluster's first start). They
    are asked for again when a heartbeat answer says the metadata changed (every change of users, policies and quotas
    is one), so a change applies within limits.node_heartbeat_s; and, should that be missed, every
    limits.acl_recheck_s. Until they arrived, and after a failed ask, again after limits.acl_refresh_s."""
    version = -1
    while True:
        changed = peers.metadata_changed  # one set while asking is not missed
        failed = False
        try:
            state = await peers.nameserver("MetaAclState", {"version": version})
            if state["changed"]:
                if access is not None:
                    access.update(state)
                if quotas is not None:
                    quotas.update(state["quotas"])
                version = state["version"]
        except RocketError as error:  # without auth, only quotas wait on it: no warnings while a cluster starts
            failed = True
            (log.warning if access is not None else log.debug)(
                "reading users, policies and quotas from the nameservers: %s", error)
        if access is None or access.users:
            loaded.set()
        with trio.move_on_after(limits.acl_refresh_s if failed or not loaded.is_set() else limits.acl_recheck_s):
            await changed.wait()


class _Metrics:
    """The HTTP/1.1 pages: /metrics (the telemetry registry in Prometheus's text format, once the roles run),
    /healthz (the process serves), /readyz (ready, and not draining)."""

    def __init__(self, ready: trio.Event, lifecycle: Lifecycle):
        self.ready = ready
        self.lifecycle = lifecycle
        self.telemetry: Telemetry | None = None

    def routes(self) -> dict:
        return {"/metrics": self.metrics, "/healthz": self.healthz, "/readyz": self.readyz}

    async def metrics(self):
        if self.telemetry is None:
            return 503, "text/plain; charset=utf-8", b"starting: no metrics yet\n"
        return 200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest(self.telemetry.registry)

    async def healthz(self):
        return 200, "text/plain; charset=utf-8", b"ok\n"

    async def readyz(self):
        if self.lifecycle.draining.is_set():
            return 503, "text/plain; charset=utf-8", b"draining\n"
        if not self.ready.is_set():
            return 503, "text/plain; charset=utf-8", b"starting\n"
        return 200, "text/plain; charset=utf-8", b"ready\n"


def node_telemetry(config: NodeConfig, roles: Roles, lifecycle: Lifecycle, dispatcher: Dispatcher,
                   mqtt: MqttGateway | None = None) -> Telemetry:
    """The node's metrics registry, fed by its Raft host, peers, listeners, dispatcher, store and MQTT gateway."""
    import rocket
    from rocket.store.meter import QueueMeter
    from rocket.telemetry import families

    telemetry = Telemetry(config.node_id, config.data_dir)
    dispatcher.on_call = telemetry.observe_call
    host, store = roles.host, roles.storage.store if roles.storage is not None else None
    roles.peers.telemetry = telemetry
    host.rounds.on_fsync = telemetry.observe_fsync
    telemetry.add_collector(raft_metrics(host, store))
    telemetry.add_collector(traffic_metrics(lifecycle.traffic))
    host.on_commit = telemetry.commit_seconds.observe
    telemetry.add_collector(families.node_metrics(config.node_id, config.roles, rocket.__version__,
                                                  lifecycle.draining.is_set))
    telemetry.add_collector(families.raft_state_metrics(host))
    telemetry.add_collector(families.access_metrics(dispatcher.guard.access, dispatcher.metering.quotas))
    if store is not None and roles.storage is not None:  # both or neither: store is roles.storage's
        telemetry.traffic = lambda: (store.take_traffic(), {group for group in host.groups if host.leads(group)})
        telemetry.add_collector(families.store_metrics(QueueMeter(store), host.leads, config.metrics_per_queue))
        telemetry.add_collector(families.tier_metrics(roles.storage.tiering.offloader, roles.storage.cold))
        telemetry.add_collector(families.kv_metrics(roles.storage.kv, host.leads))
    if mqtt is not None:
        telemetry.add_collector(families.mqtt_metrics(mqtt))
    return telemetry


async def _run_node(config: NodeConfig, objects, handle_signals: bool, task_status, ready: trio.Event,
                    pretouch_bytes: int, freeze_startup: bool) -> None:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    dispatcher = Dispatcher()
    lifecycle = Lifecycle()
    clock = Clock()
    # A storage node's WAL holds the batches its store indexes: checkpoints keep its old segments, the
    # storage role deletes them once nothing lies in them that it reads (WalReclaim.reclaim, roles/storage/reclaim.py).
    wal = Wal.open(config.data_dir / "raft", config.wal_segment_bytes, keep_segments="storage" in config.roles,
                   cached_bytes=config.wal_cached_bytes, direct=config.wal_direct_io)
    if config.wal_direct_io and not wal.log.direct:
        log.warning("wal_direct_io: %s has no O_DIRECT, so the WAL writes through the page cache", wal.log.directory)
    stop = trio.Event()
    storage: StorageRole | None = None
    tls = NodeTls(config)  # config.load checked that the files load
    peer_auth = _peer_auth(config, dispatcher, clock, tls)
    access = _access(config, dispatcher, clock)
    try:
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_wait_for_signal, stop, tls.reload)
            if (watchdog_s := watchdog_interval_s()) is not None:
                nursery.start_soon(_keep_watchdog, watchdog_s)  # from the start: a storage node's READY=1 may wait
            # Listen first: a node told to listen on port 0 tells the others the port it got.
            remoting = None  # RocketMQ's remoting clients, on the same port (told apart by their first bytes)
            if "broker" in config.roles or "nameserver" in config.roles:
                gateway = RemotingGateway(dispatcher, clock, lifecycle, frame_s=config.tcp_frame_s, idle_s=config.tcp_idle_s)
                await nursery.start(gateway.run)
                # gateway.serve takes any trio Stream (a TLS one too: it reaches the socket through transport_stream),
                # though its annotation says SocketStream.
                serve_remoting = cast(Callable[[trio.abc.Stream, bytes], Awaitable[None]], gateway.serve)
                remoting = (looks_like_remoting, serve_remoting)
            tcp_port = await _listen(partial(nursery.start, partial(serve_tcp, other=remoting, tls=tls, frame_s=config.tcp_frame_s,
                                                                    idle_s=config.tcp_idle_s), dispatcher, lifecycle,
                                             config.listen.host, config.listen.port), "TCP, --listen", config.listen)
            if config.listen.port == 0:
                config = dataclasses.replace(config, listen=Address(config.listen.host, tcp_port))
            http2_port = None
            if config.http2_listen is not None:
                listen = config.http2_listen
                grpc = {}  # RocketMQ 5 clients, served by brokers
                if "broker" in config.roles:
                    grpc = rocketmq_services(dispatcher, clock, config.rocketmq_max_attempts)
                http2_port = await _listen(partial(nursery.start, partial(serve_http2, grpc=grpc, tls=lambda: tls.http2,
                                                           idle_s=config.http2_idle_s, request_s=config.http2_request_s),
                                                   dispatcher, lifecycle, listen.host, listen.port),
                                           "HTTP/2, --http2-listen", listen)
            http_port, metrics = None, _Metrics(ready, lifecycle)
            if config.http_listen is not None:
                console = Console(dispatcher, clock, config.node_id, tuple(config.roles))  # read-only
                await nursery.start(console.run)
                http_port = await _listen(partial(nursery.start, partial(serve_http1, tls=lambda: tls.http1), lifecycle,
                                                  config.http_listen.host, config.http_listen.port,
                                                  {**console.routes(), **metrics.routes()}),
                                          "HTTP/1.1, --http-listen", config.http_listen)
            mqtt_port, mqtt = None, None
            if config.mqtt_listen is not None and "broker" in config.roles:
                mqtt = MqttGateway(dispatcher, clock, lifecycle, config.mqtt_namespace, config.mqtt_topic)
                await nursery.start(mqtt.run)
                mqtt_port = await _listen(partial(nursery.start, partial(mqtt.listen, config.mqtt_listen.host,
                                                                         config.mqtt_listen.port, lambda: tls.mqtt)),
                                          "MQTT, --mqtt-listen", config.mqtt_listen)
            addresses = {node: (address.host, address.port)
                         for node, address in {**config.nameserver_members(), **config.controller_members()}.items()}
            # In permissive mode (a cluster moving to TLS) a node falls back to plain to a node without TLS yet.
            fallback = tls.mode == "permissive"
            versions_file = config.data_dir / peer_versions.PEER_VERSIONS_FILE
            links = PeerLinks(config.node_id, addresses, peer_auth, tls=lambda: tls.peer, plain_fallback=fallback,
                              versions=peer_versions.load(versions_file),
                              keep_versions=partial(peer_versions.keep, versions_file))
            host = RaftHost(config.node_id, wal, links.post, tick_s=config.raft_tick_s)
            host.peer_versions = links.versions  # what release each peer runs: see Engine.replicas_speak
            pool = ChannelPool(hello=peer_auth.hello if peer_auth is not None else None, tls=lambda: tls.peer,
                               plain_fallback=fallback)
            roles = build_roles(config, host, Peers(config, dispatcher, pool), dispatcher, clock, addresses, objects)
            storage = roles.storage
            await nursery.start(pool.run)
            await nursery.start(links.run)
            await roles.start(nursery)
            quotas = None
            if "broker" in config.roles:  # client quotas: enforced by the dispatcher, on brokers (rocket/quotas.py)
                dispatcher.metering.quotas = quotas = Quotas(clock.now_s)
            if access is not None or quotas is not None:
                loaded = trio.Event()
                nursery.start_soon(_follow_acl, access, quotas, roles.peers, loaded)
                if access is not None:  # ready once it knows users, or after a bound (no nameserver answers yet)
                    with trio.move_on_after(limits.acl_first_wait_s_max):
                        await loaded.wait()
            telemetry = node_telemetry(config, roles, lifecycle, dispatcher, mqtt)
            metrics.telemetry = telemetry
            if config.telemetry_interval_s:
                spool = await trio.to_thread.run_sync(partial(Spool, config.data_dir / "telemetry"))
                await nursery.start(partial(run_telemetry, telemetry, spool, objects, config.telemetry_interval_s,
                                            prefix=config.tier_key(KEY_PREFIX_DEFAULT)))
            if storage is not None:
                with trio.CancelScope() as waiting:  # registered with the nameservers: topics can be placed here
                    nursery.start_soon(cancel_on, stop, waiting)  # unless told to stop first
                    await storage.assigned.wait()
            if not stop.is_set():
                http2 = f"{config.http2_listen.host}:{http2_port}" if http2_port and config.http2_listen else "off"
                http = f"{config.http_listen.host}:{http_port}" if http_port and config.http_listen else "off"
                mqtt_at = f"{config.mqtt_listen.host}:{mqtt_port}" if mqtt_port and config.mqtt_listen else "off"
                print(f"rocket ready tcp={config.listen.host}:{tcp_port} http2={http2} "
                      f"node={config.node_id} roles={','.join(config.roles)} data={config.data_dir} "
                      f"pid={os.getpid()} http={http} mqtt={mqtt_at}",
                      flush=True)
                ready.set()
                _notify_systemd("READY=1")
                task_status.started(Ready(tcp_port, http2_port, http_port, mqtt_port))
                if pretouch_bytes:
                    nursery.start_soon(touch_heap, pretouch_bytes)
                if freeze_startup:
                    gc.freeze()
            await stop.wait()
            log.info("shutting down: draining %d calls in flight", lifecycle.calls_in_flight)
            _notify_systemd("STOPPING=1")
            lifecycle.drain()
            with trio.move_on_after(config.shutdown_grace_s):
                if mqtt is not None:
                    await mqtt.close()  # devices' wills and sessions kept while storage answers
                await lifecycle.wait_idle()
            nursery.cancel_scope.cancel()
    finally:
        if storage is not None:
            try:
                storage.store.close()
            except OSError as error:  # a LevelDB that a full disk stopped: the WAL, closed next, holds what it lost
                log.warning("the store could not be synced as it closed: %s", error)
        wal.close()
    log.info("stopped")


async def _wait_for_signal(stop: trio.Event, reload=None) -> None:
    """SIGTERM or SIGINT: stop. SIGHUP: reload (the TLS certificates), and go on."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            if signum == signal.SIGHUP:
                if reload is not None:
                    reload()
                continue
            stop.set()
            return
