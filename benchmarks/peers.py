"""The systems benchmarks/run.py compares: each starts its server on 127.0.0.1 (free ports, data under a
directory it is given), states its durability setting, and gives the harness producers that send a prepared
batch and return once the server acknowledged it, and a reader that counts a stream from its start."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from contextlib import asynccontextmanager, suppress
from pathlib import Path

from rocket.transport.listen import free_ports

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
READ_BATCH_MESSAGES = 1000  # messages a Redis reader asks for per XREAD
# Debian installs some servers in sbin and RabbitMQ's own scripts outside PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/lib/rabbitmq/bin",
                               "/usr/lib/erlang/bin"])


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


class ServerProcess:
    """One server in its own session, so that stopping it also stops the processes it started."""

    def __init__(self, command: list[str], log_file: Path, environment: dict | None = None, **options):
        self.log_file = log_file
        self._log = log_file.open("ab")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, **(environment or {})}, **options)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for_port(self, port: int, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.log_file.stem} exited with {self.process.returncode}: {self.log_tail()}")
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.log_file.stem} did not listen on {port} within {timeout_s} s: {self.log_tail()}")

    def log_tail(self, characters: int = 2000) -> str:
        self._log.flush()
        return self.log_file.read_text(errors="replace")[-characters:]

    def stop(self) -> None:
        """SIGTERM to the whole session, SIGKILL to whatever is left after STOP_TIMEOUT_S."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(STOP_TIMEOUT_S)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(STOP_TIMEOUT_S)
        self._log.close()


class System:
    """What the harness needs from each system. Producers and readers are used from one task each."""

    name = ""
    backend = "asyncio"  # the event loop its client runs on, through anyio
    binaries: tuple[str, ...] = ()  # what must be installed, and the Debian packages that install it
    packages: tuple[str, ...] = ()
    durability = ""
    reads_bodies = False  # read() also takes bodies=True: bodies only, without an object made per message

    def missing(self) -> str | None:
        """Why this system cannot run here, or None."""
        absent = [name for name in self.binaries if find_binary(name) is None]
        if absent:
            return f"{', '.join(absent)} is not installed (apt-get install {' '.join(self.packages)})"
        return None

    @property
    def server_pid(self) -> int:
        return self.server.pid

    def start(self, directory: Path) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.server.stop()

    def prepare(self, stream: str, count: int, body: bytes):
        """A batch of count messages in the form the producer sends; built before the clock starts."""
        raise NotImplementedError

    async def create(self, stream: str) -> None:
        raise NotImplementedError

    def producer(self, stream: str):
        """An async context manager yielding an object whose `send(batch)` returns once it is acknowledged."""
        raise NotImplementedError

    async def read(self, stream: str, messages: int, timeout_s: float) -> tuple[int, int, float]:
        """Read from the start of stream until `messages` arrived or timeout_s passed; (messages, body bytes,
        seconds). The seconds run from the first request for messages, once connected and set up, to the
        last message counted: neither connecting nor closing is part of a system's read."""
        raise NotImplementedError


class Rocket(System):
    name = "rocket"
    backend = "trio"
    reads_bodies = True
    durability = ("fdatasync before every acknowledgement, one per round of batches (group commit: strace saw 19 "
                  "for 20 batches of 1 MiB), one dev-mode node")

    def missing(self) -> str | None:
        return None

    def start(self, directory: Path) -> None:
        # The same start-up as benchmarks/produce.py, so the two harnesses measure the same server.
        from produce import start_nodes

        self.process = start_nodes(directory, 1)[0]
        ready = re.search(rb"tcp=[^:]+:(\d+)", self.process.stdout.readline())
        if ready is None:
            self.stop()
            raise RuntimeError("rocket run did not report its TCP port")
        self.address = f"{HOST}:{ready.group(1).decode()}"

    @property
    def server_pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def prepare(self, stream: str, count: int, body: bytes) -> bytes:
        from rocket import limits
        from rocket.client.bench import build_batches

        batches = build_batches(count, len(body), limits.batch_bytes_max)
        assert len(batches) == 1, "a prepared batch is one rocket batch"
        return batches[0]

    @asynccontextmanager
    async def _channel(self):
        from rocket.client import connect

        async with connect(self.address, "tcp", "lane") as channel:
            yield channel

    async def create(self, stream: str) -> None:
        async with self._channel() as channel:
            await channel.call("CreateTopic", {"topic": stream, "queues": 8})

    @asynccontextmanager
    async def producer(self, stream: str):
        from rocket.serde import batch as batch_codec

        async with self._channel() as channel:

            class Sender:
                # One Produce call per batch, any queue: what Producer.send_encoded sends.
                async def send(self, encoded: bytes) -> None:
                    answer = await channel.call("Produce", {"topic": stream, "queue": -1, "batch": encoded})
                    assert answer["count"] == batch_codec.peek_count(encoded), answer

            yield Sender()

    async def read(self, stream: str, messages: int, timeout_s: float,
                   bodies: bool = False) -> tuple[int, int, float]:
        import trio

        from rocket import limits
        from rocket.client import Consumer

        received = payload = 0
        async with self._channel() as channel:
            consumer = Consumer(channel, stream, f"bench-{uuid.uuid4().hex[:8]}", start="earliest", wait_ms=200,
                                max_bytes=limits.read_bytes_max)
            await consumer.open()
            started = time.perf_counter()
            with trio.move_on_after(timeout_s):
                while received < messages:
                    if bodies:
                        found = await consumer.poll_bodies()
                        payload += sum(map(len, found))
                    else:
                        found = await consumer.poll()
                        payload += sum(len(message.body) for message in found)
                    received += len(found)
                    del found  # done with them before the next poll, as a loop over each poll is (not freed cold)
            seconds = time.perf_counter() - started
        return received, payload, seconds


class Nats(System):
    name = "nats"
    binaries = ("nats-server",)
    packages = ("nats-server",)
    durability = ("JetStream file storage, acknowledged once written to the OS; nats-server 2.9 fsyncs every "
                  "sync_interval (default 2 min), not per write (strace saw none in a 20,000-message produce)")

    def start(self, directory: Path) -> None:
        (self.port,) = free_ports(1)
        self.server = ServerProcess([find_binary("nats-server"), "--js", "-sd", str(directory / "nats"), "-a", HOST,
                                     "-p", str(self.port)], directory / "nats-server.log")
        self.server.wait_for_port(self.port)

    def prepare(self, stream: str, count: int, body: bytes) -> list[bytes]:
        return [body] * count

    @asynccontextmanager
    async def _connection(self):
        import nats

        connection = await nats.connect(f"nats://{HOST}:{self.port}", allow_reconnect=False)
        try:
            yield connection
        finally:
            await connection.close()

    async def create(self, stream: str) -> None:
        from nats.js.api import StorageType

        async with self._connection() as connection:
            await connection.jetstream().add_stream(name=stream, subjects=[stream], storage=StorageType.FILE)

    @asynccontextmanager
    async def producer(self, stream: str):
        """JetStream publishes with a reply subject per batch; the batch is done when every PubAck is in."""
        async with self._connection() as connection:
            inbox = connection.new_inbox()
            waiting: dict[str, list] = {}  # reply subject -> [acknowledgements missing, future]

            async def on_ack(message) -> None:
                entry = waiting[message.subject]
                if not message.data.startswith(b'{"stream"'):
                    if not entry[1].done():
                        entry[1].set_exception(RuntimeError(f"JetStream refused a message: {message.data[:200]!r}"))
                    return
                entry[0] -= 1
                if entry[0] == 0 and not entry[1].done():
                    entry[1].set_result(None)

            await connection.subscribe(f"{inbox}.*", cb=on_ack, pending_msgs_limit=-1, pending_bytes_limit=-1)
            numbers = itertools.count()

            class Sender:
                async def send(self, bodies: list[bytes]) -> None:
                    reply = f"{inbox}.{next(numbers)}"
                    done = asyncio.get_running_loop().create_future()
                    waiting[reply] = [len(bodies), done]
                    for body in bodies:
                        await connection.publish(stream, body, reply=reply)
                    try:
                        await done
                    finally:
                        del waiting[reply]

            yield Sender()

    async def read(self, stream: str, messages: int, timeout_s: float) -> tuple[int, int, float]:
        """An ordered push consumer (flow-controlled, no acknowledgements): the fastest way nats-py reads a
        stream; a pull consumer's fetch of 1,000 at a time was 4x slower here."""
        counts = [0, 0]
        done = asyncio.Event()

        async def on_message(message) -> None:
            counts[0] += 1
            counts[1] += len(message.data)
            if counts[0] >= messages:
                done.set()

        async with self._connection() as connection:
            started = time.perf_counter()  # the subscription creates the consumer and starts the delivery
            subscription = await connection.jetstream().subscribe(stream, cb=on_message, ordered_consumer=True,
                                                                   pending_msgs_limit=-1, pending_bytes_limit=-1)
            try:
                await asyncio.wait_for(done.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
            seconds = time.perf_counter() - started
            await subscription.unsubscribe()
        return counts[0], counts[1], seconds


class Redis(System):
    binaries = ("redis-server",)
    packages = ("redis-server",)

    def __init__(self, appendfsync: str):
        self.appendfsync = appendfsync
        self.name = f"redis-{appendfsync}"
        self.durability = {
            "always": "AOF with appendfsync always: fdatasync of each event-loop round's writes before the replies "
                      "(strace: 1,122 for 20,000 messages from one connection, which Redis reads 16 KiB at a time)",
            "everysec": "AOF with appendfsync everysec: written to the OS before the reply, fsync once a second",
        }[appendfsync]

    def start(self, directory: Path) -> None:
        (self.port,) = free_ports(1)
        data = directory / self.name
        data.mkdir(parents=True)
        self.server = ServerProcess(
            [find_binary("redis-server"), "--port", str(self.port), "--bind", HOST, "--dir", str(data),
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "", "--daemonize", "no"],
            directory / f"{self.name}.log")
        self.server.wait_for_port(self.port)

    def prepare(self, stream: str, count: int, body: bytes) -> tuple[bytes, int]:
        from redis.asyncio.connection import Connection

        packed = Connection().pack_commands([("XADD", stream, "*", "d", body)] * count)
        return b"".join(bytes(part) for part in packed), count

    @asynccontextmanager
    async def _client(self):
        from redis.asyncio import Redis as Client

        client = Client(host=HOST, port=self.port)
        try:
            yield client
        finally:
            await client.aclose()

    async def create(self, stream: str) -> None:
        """A stream appears with its first XADD."""

    @asynccontextmanager
    async def producer(self, stream: str):
        """One connection, pipelined: a batch is written whole (packed before the clock), and one task reads
        the replies in order and completes each batch once its last XADD is answered."""
        from redis.exceptions import ResponseError

        async with self._client() as client:
            connection = await client.connection_pool.get_connection()
            sent: asyncio.Queue = asyncio.Queue()  # (replies expected, future), in the order written
            writing = asyncio.Lock()

            async def read_replies() -> None:
                while True:
                    count, done = await sent.get()
                    refused = None
                    try:
                        for _ in range(count):
                            try:
                                await connection.read_response()
                            except ResponseError as error:
                                refused = refused or error
                    except Exception as error:  # the connection failed: so do this batch and all behind it
                        done.set_exception(error)
                        while not sent.empty():
                            sent.get_nowait()[1].set_exception(error)
                        return
                    if refused is not None:
                        done.set_exception(refused)
                    else:
                        done.set_result(None)

            class Sender:
                async def send(self, prepared: tuple[bytes, int]) -> None:
                    packed, count = prepared
                    done = asyncio.get_running_loop().create_future()
                    async with writing:
                        sent.put_nowait((count, done))
                        await connection.send_packed_command(packed, check_health=False)
                    await done

            reader = asyncio.create_task(read_replies())
            try:
                yield Sender()
            finally:
                reader.cancel()
                with suppress(asyncio.CancelledError):
                    await reader
                await client.connection_pool.release(connection)

    async def read(self, stream: str, messages: int, timeout_s: float) -> tuple[int, int, float]:
        received = payload = 0
        last_id = b"0"
        deadline = time.monotonic() + timeout_s
        async with self._client() as client:
            started = time.perf_counter()
            while received < messages and time.monotonic() < deadline:
                answer = await client.xread({stream: last_id}, count=READ_BATCH_MESSAGES, block=200)
                for _, entries in answer:
                    received += len(entries)
                    payload += sum(len(fields[b"d"]) for _, fields in entries)
                    last_id = entries[-1][0]
            seconds = time.perf_counter() - started
        return received, payload, seconds


class RabbitMQ(System):
    name = "rabbitmq"
    binaries = ("epmd",)
    packages = ("rabbitmq-server",)
    # The Debian wrapper in /usr/sbin switches to the rabbitmq user; as root we run the server script directly.
    server_script = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")

    def missing(self) -> str | None:
        if not self.server_script.exists():
            return f"{self.server_script} is not installed (apt-get install rabbitmq-server)"
        return super().missing()
    durability = ("stream on one node, confirmed once written to the OS: no fsync per write (strace saw 2 fsyncs "
                  "in a 20,000-message produce); streams rely on replication")
    frame_bytes_max = 8 * 1024 * 1024  # a 1 MiB batch and its framing fit one Publish frame

    def start(self, directory: Path) -> None:
        home = directory / "rabbitmq"
        (home / "mnesia").mkdir(parents=True)
        (home / "log").mkdir()
        self.amqp_port, self.port, distribution_port, epmd_port = free_ports(4)
        (home / "rabbitmq.conf").write_text("\n".join([
            f"listeners.tcp.1 = {HOST}:{self.amqp_port}",
            f"stream.listeners.tcp.1 = {HOST}:{self.port}",
            f"stream.advertised_host = {HOST}",
            f"stream.advertised_port = {self.port}",
            f"stream.frame_max = {self.frame_bytes_max}",
            "log.console = true", "log.console.level = warning", "log.file = false", ""]))
        (home / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        (home / "rabbitmq-env.conf").write_text("")
        environment = {
            "HOME": str(home),  # the Erlang cookie goes here
            "RABBITMQ_NODENAME": f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost",
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"), "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(home / "rabbitmq.pid"),
            "RABBITMQ_DIST_PORT": str(distribution_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_PORT": str(epmd_port), "ERL_EPMD_ADDRESS": HOST,
        }
        # Our own epmd on a free port, started first so that the node registers with it and not with a
        # machine-wide daemon on 4369; stopping it is then ours to do.
        self.epmd = ServerProcess([find_binary("epmd"), "-port", str(epmd_port), "-address", HOST],
                                  directory / "epmd.log", environment)
        self.epmd.wait_for_port(epmd_port)
        self.server = ServerProcess([str(self.server_script)], directory / "rabbitmq-server.log", environment, cwd=home)
        try:
            self.server.wait_for_port(self.port)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            self.epmd.stop()

    def prepare(self, stream: str, count: int, body: bytes) -> list[bytes]:
        return [body] * count

    def _client_options(self) -> dict:
        return {"host": HOST, "port": self.port, "username": "guest", "password": "guest",
                "frame_max": self.frame_bytes_max}

    async def create(self, stream: str) -> None:
        from rstream import Producer

        async with Producer(**self._client_options()) as producer:
            await producer.create_stream(stream, exists_ok=True)

    @asynccontextmanager
    async def producer(self, stream: str):
        from rstream import Producer

        async with Producer(**self._client_options()) as producer:

            class Sender:
                async def send(self, bodies: list[bytes]) -> None:
                    done = asyncio.get_running_loop().create_future()
                    missing = len(bodies)

                    def confirmed(status) -> None:
                        nonlocal missing
                        if not status.is_confirmed and not done.done():
                            done.set_exception(RuntimeError(f"RabbitMQ refused a message: {status}"))
                        missing -= 1
                        if missing == 0 and not done.done():
                            done.set_result(None)

                    await producer.send_batch(stream, bodies, on_publish_confirm=confirmed)
                    await done

            yield Sender()

    async def read(self, stream: str, messages: int, timeout_s: float) -> tuple[int, int, float]:
        from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

        counts = [0, 0]
        done = asyncio.Event()

        def on_message(body: bytes, context) -> None:
            counts[0] += 1
            counts[1] += len(body)
            if counts[0] >= messages:
                done.set()

        async with Consumer(**self._client_options()) as consumer:
            started = time.perf_counter()  # the subscription starts the delivery
            await consumer.subscribe(stream, on_message, decoder=bytes,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            try:
                await asyncio.wait_for(done.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
            seconds = time.perf_counter() - started
        return counts[0], counts[1], seconds


SYSTEMS = {system.name: system for system in (Rocket(), Nats(), Redis("always"), Redis("everysec"), RabbitMQ())}
