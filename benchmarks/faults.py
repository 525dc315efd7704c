"""Real faults on one node of a local cluster (examples/cluster), each changeable while the node runs, and a label
per fault run ({"kind", "node", "node_id", "severity", "start_ms", "end_ms", "fault"}, wall-clock ms, one JSON line
each) for the unhealthy-node detector to train on. Kinds: slow_disk (a FUSE passthrough that delays fsync, as Scylla's
CharybdeFS), link (a TCP proxy with latency, jitter, stalls as loss, a bandwidth limit and resets), cpu (cgroup
v2 cpu.max; cpu.cfs_quota_us where the cpu controller is bound to a v1 hierarchy), control (no fault: counts
false positives).

    # Before `cluster.sh start`: put storage2's data dir on slowfs (factor 1) and its inbound links behind a proxy.
    python benchmarks/faults.py prepare --base /tmp/fx/rc --node storage2 --slow-disk --proxy [--port-base 9500]
    PORT_BASE=9500 examples/cluster/cluster.sh start /tmp/fx/rc
    # 10 s from now, make storage2's disk 10x slower for 60 s; append the label.
    python benchmarks/faults.py run --base /tmp/fx/rc --node storage2 --kind slow_disk --severity 10 \
        --after-s 10 --for-s 60 --labels /tmp/fx/labels.jsonl
    # storage2's inbound links stall 5% of their chunks (as lost segments) for 60 s.
    python benchmarks/faults.py run --base /tmp/fx/rc --node storage2 --kind link --loss --severity 5 --for-s 60 \
        --labels /tmp/fx/labels.jsonl
    examples/cluster/cluster.sh stop /tmp/fx/rc
    python benchmarks/faults.py teardown --base /tmp/fx/rc      # stops the proxies, unmounts slowfs

Severity: slow_disk, the factor N (each fsync takes N times its real time, at least N x 0.5 ms); link, the one-way
latency in ms added to every chunk the proxy forwards (jitter: a fifth of it), or with --loss the percentage of chunks
stalled LOSS_STALL_S as a lost segment would be; cpu, the factor N (cpu.max gives the process 1/N of one CPU);
control, anything (recorded as given). A label also carries "fault": the settings applied (the proxy's or slowfs's
control values, or the CPU quota). A fault starts when `run` writes it, and slowfs and the proxy pick it up within
CONTROL_POLL_S.

prepare --slow-disk moves BASE/NODE/data to BASE/NODE/data.backing (once) and mounts slowfs on BASE/NODE/data, run by
`faults.py slowfs` (control file BASE/NODE/slowfs.json: {"factor": N, "write_delay_ms": W, "lazy": true|false,
"crash": C}; lazy, raising C drops every write not fsynced, as a power loss would: crash_slowfs). prepare --proxy starts
`faults.py proxy` on 127.0.0.1:(PORT_BASE + node id + 50) in front of the node (control file BASE/NODE/proxy.json:
{"latency_ms", "jitter_ms", "loss", "bandwidth_bytes_per_s", "reset", "partition", "partition_mode", "partition_from"})
and writes BASE/NODE/node.env with ROCKET_ADVERTISE=that address, which cluster.sh adds to the node's environment: the
other nodes then reach the node through the proxy (the node's own outgoing connections do not pass it). This works for
storage nodes and brokers, whose address the others learn from the nameservers; the nameservers' addresses are fixed by
--nameservers. teardown (after `cluster.sh stop`) leaves data.backing, which the next prepare mounts again.

A partition ("partition": which directions are cut, "partition_mode": hold or reset) cuts every caller of the proxy
alike, unless "partition_from" lists substrings of command lines: then it cuts only the connections opened by a
process on this machine whose command line (/proc/PID/cmdline, arguments joined by spaces) contains one of them, and
the others pass (latency, loss, resets and the bandwidth limit still apply to every connection). Nodes on 127.0.0.1
that each have a proxy in front can so be cut two ways or into a majority and a minority: each node's proxy cuts the
callers on the other side. Or each node gets a proxy per peer: benchmarks/routed.py runs a node whose calls to given
addresses go to given proxies instead (tests/integration/test_partitions.py).

The tools alone:
    python benchmarks/faults.py slowfs BACKING MOUNTPOINT --control FILE
    python benchmarks/faults.py proxy 127.0.0.1:LISTEN_PORT HOST:PORT --control FILE
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import trio

from slowfs import DiskSettings, make_operations

CONTROL_POLL_S = 0.5  # how soon slowfs and the proxy see a changed control file
LOSS_STALL_S = 0.2  # a lost segment costs TCP about one minimum retransmission timeout (200 ms on Linux)
CHUNK_BYTES_MAX = 64 * 1024  # the most the proxy reads, delays and forwards as one chunk
PROXY_QUEUE_CHUNKS_MAX = 16  # chunks in flight inside the proxy per direction (bounds its memory)
MOUNT_WAIT_S = 10.0
STOP_WAIT_S = 10.0
PARTITION_POLL_S = 0.02  # how often a held chunk or connection looks whether the partition healed
PARTITIONS = ("", "to_target", "from_target", "both")
PARTITION_MODES = ("hold", "reset")
SOURCE_LOOKUP_S = 5.0  # the most time the proxy spends finding which process opened a connection (then: unknown)
PROXY_PORT_OFFSET = 50  # a node's proxy listens on PORT_BASE + node id + 50 (cluster.sh uses up to + 32)
NODE_IDS = {"ns1": 1, "ns2": 2, "ns3": 3, "storage1": 11, "storage2": 12, "storage3": 13, "broker1": 21, "broker2": 22}
KINDS = ("slow_disk", "link", "cpu", "control")
CGROUP_PARENT = "rocket-faults"
CPU_PERIOD_US = 100_000
NODE_ENV_HEADER = "# written by benchmarks/faults.py prepare; teardown removes it\n"


class FaultError(Exception):
    """A fault that cannot be applied, with a one-line reason."""


# ---- control files: JSON that a running tool polls


def write_control(path: Path, values: dict) -> None:
    """Atomically, so that a poller never reads half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(values) + "\n")
    os.replace(temporary, path)


async def follow_control(path: Path, apply, interval_s: float = CONTROL_POLL_S) -> None:
    """Call apply(dict) with the file's content now and whenever it changes; a bad file keeps the last settings."""
    seen = None
    while True:
        try:
            status = path.stat()
            version = (status.st_mtime_ns, status.st_size, status.st_ino)
            if version != seen:
                seen = version
                apply(json.loads(path.read_text()))
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, OSError) as error:
            print(f"faults: control file {path}: {error}; keeping the last settings", file=sys.stderr, flush=True)
        await trio.sleep(interval_s)


def settings_from(cls, values: dict):
    """The settings of a control file's values, each of its field's type (the type of the field's default)."""
    known = {each.name: type(each.default) for each in fields(cls)}
    unknown = set(values) - set(known)
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}; known: {sorted(known)}")
    for key, value in values.items():
        if known[key] is tuple and not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} is a list")  # tuple("text") would split it into characters
    settings = cls(**{key: known[key](value) for key, value in values.items()})
    settings.check()
    return settings


# ---- link: a TCP fault proxy


@dataclass(frozen=True)
class LinkSettings:
    latency_ms: float = 0.0  # added to every chunk, each direction
    jitter_ms: float = 0.0  # uniform in [-jitter, +jitter] on top of the latency; order is kept
    loss: float = 0.0  # probability per chunk of a LOSS_STALL_S stall (TCP retransmits; it never loses bytes)
    bandwidth_bytes_per_s: float = 0.0  # per connection and direction; 0: unlimited
    reset: float = 0.0  # probability per chunk that the proxy resets both connections
    # A partition: the directions whose bytes do not pass ("to_target": client to target, "from_target", "both").
    partition: str = ""
    # hold: the bytes wait, as TCP retransmits across a partition, and pass once it heals; a new connection is
    # accepted but gets no answer (no handshake crosses a partition). reset: such connections are reset instead.
    partition_mode: str = "hold"
    # When not empty, the partition cuts only the connections whose client process's command line contains one of
    # these substrings (a client not found, as one on another machine, has the empty command line); others pass.
    partition_from: tuple[str, ...] = ()

    def check(self) -> None:
        if min(self.latency_ms, self.jitter_ms, self.bandwidth_bytes_per_s) < 0:
            raise ValueError("latency_ms, jitter_ms and bandwidth_bytes_per_s must not be negative")
        if not (0 <= self.loss <= 1 and 0 <= self.reset <= 1):
            raise ValueError("loss and reset are probabilities from 0 to 1")
        if self.partition not in PARTITIONS:
            raise ValueError(f"partition is one of {PARTITIONS}")
        if self.partition_mode not in PARTITION_MODES:
            raise ValueError(f"partition_mode is one of {PARTITION_MODES}")
        if not all(isinstance(marker, str) and marker for marker in self.partition_from):
            raise ValueError("partition_from is a list of non-empty strings")

    def blocks(self, direction: str, source: str) -> bool:
        """Whether bytes going direction ("to_target" or "from_target") on a connection that the process with the
        command line source opened are cut off."""
        return self.partition in (direction, "both") and (
            not self.partition_from or any(marker in source for marker in self.partition_from))


class Holder:
    """The settings now in force; the control follower replaces them."""

    def __init__(self, settings):
        self.settings = settings


def abort(stream: trio.SocketStream) -> None:
    """Make the coming close send RST, as a crashed peer or a middlebox reset would."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def _normal_address(host: str, port: int) -> tuple[str, int]:
    """An IPv4 address mapped into IPv6 (::ffff:127.0.0.1) as the IPv4 address, so either family compares equal."""
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return str(address), port


def parse_proc_net_tcp_line(line: str) -> tuple[tuple[str, int], tuple[str, int], int] | None:
    """(local address, remote address, socket inode) of one line of /proc/net/tcp or /proc/net/tcp6; None for the
    header. The kernel prints an address as its 32-bit words in host byte order, in hex: 0100007F:1F90 is
    127.0.0.1:8080 on a little-endian machine."""
    columns = line.split()
    if len(columns) < 10 or not columns[0].endswith(":") or not columns[0][:-1].isdigit():
        return None

    def address(text: str) -> tuple[str, int]:
        host, port = text.split(":")
        words = struct.unpack(f">{len(host) // 8}I", bytes.fromhex(host))
        packed = struct.pack(f"={len(words)}I", *words)
        family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
        return _normal_address(socket.inet_ntop(family, packed), int(port, 16))

    return address(columns[1]), address(columns[2]), int(columns[9])


def _socket_inode(local: tuple[str, int], remote: tuple[str, int]) -> int:
    """The inode of the socket on this machine from local to remote (normal addresses); 0 when there is none."""
    ports = (f":{local[1]:04X} ", f":{remote[1]:04X} ")  # a cheap filter before parsing a line
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                for line in lines:
                    entry = ports[0] in line and ports[1] in line and parse_proc_net_tcp_line(line)
                    if entry and entry[0] == local and entry[1] == remote and entry[2]:
                        return entry[2]
        except OSError:
            pass
    return 0


def _socket_owner(inode: int, deadline: float) -> int | None:
    """The pid of a process with the socket of inode open; None when none is found before deadline (time.monotonic)."""
    link = f"socket:[{inode}]"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        if time.monotonic() > deadline:
            return None
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to look at
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") == link:
                    return int(pid)
            except OSError:
                pass
    return None


def command_line(pid: int) -> str:
    """The process's arguments joined by spaces; empty when it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            arguments = file.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    return " ".join(argument.decode(errors="replace") for argument in arguments)


def connection_source(peer: tuple, local: tuple, budget_s: float = SOURCE_LOOKUP_S) -> str:
    """The command line of the process on this machine that opened the connection the proxy accepted from peer on
    local (its socket's addresses): the socket whose local address is peer and remote address is local. Empty when
    not found within budget_s (gone, another machine's, or not ours to look at). Blocks: run it in a thread."""
    deadline = time.monotonic() + budget_s
    try:
        inode = _socket_inode(_normal_address(*peer[:2]), _normal_address(*local[:2]))
    except ValueError:  # not an IP address
        return ""
    pid = _socket_owner(inode, deadline) if inode else None
    return command_line(pid) if pid is not None else ""


async def client_command_line(client: trio.SocketStream) -> str:
    """connection_source of an accepted connection, found in a worker thread; one not found is said on stderr (a
    partition_from partition does not cut it)."""
    try:
        peer, local = client.socket.getpeername(), client.socket.getsockname()
    except OSError:  # already reset
        return ""
    source = await trio.to_thread.run_sync(connection_source, peer, local)
    if not source:
        print(f"proxy: no process found for the connection from {peer[0]}:{peer[1]}", file=sys.stderr, flush=True)
    return source


async def _read_chunks(source: trio.SocketStream, chunks: trio.MemorySendChannel) -> None:
    async with chunks:
        while chunk := await source.receive_some(CHUNK_BYTES_MAX):
            await chunks.send((trio.current_time(), chunk))


async def _held_while_partitioned(holder: Holder, direction: str, source: str) -> bool:
    """Wait while direction is held cut off for a connection from source (a command line); False when the partition
    resets connections instead."""
    while holder.settings.blocks(direction, source):
        if holder.settings.partition_mode == "reset":
            return False
        await trio.sleep(PARTITION_POLL_S)
    return True


async def _write_chunks(chunks: trio.MemoryReceiveChannel, destination: trio.SocketStream, holder: Holder,
                        reset_connection, direction: str, source: str) -> None:
    due = 0.0  # when the previous chunk went out: chunks keep their order whatever the jitter
    paced_until = 0.0
    async for arrived, chunk in chunks:
        settings: LinkSettings = holder.settings
        delay_s = max(0.0, settings.latency_ms + random.uniform(-settings.jitter_ms, settings.jitter_ms)) / 1000
        due = max(due, arrived + delay_s)
        await trio.sleep_until(due)
        if not await _held_while_partitioned(holder, direction, source):
            reset_connection()
            return
        settings = holder.settings
        if random.random() < settings.loss:
            await trio.sleep(LOSS_STALL_S)
        if random.random() < settings.reset:
            reset_connection()
            return
        if settings.bandwidth_bytes_per_s:
            paced_until = max(paced_until, trio.current_time()) + len(chunk) / settings.bandwidth_bytes_per_s
        await destination.send_all(chunk)
        if paced_until:
            await trio.sleep_until(paced_until)
        due = max(due, trio.current_time())
    await destination.send_eof()


async def _forward(reader, destination, holder: Holder, reset_connection, direction: str, source: str) -> None:
    send, receive = trio.open_memory_channel(PROXY_QUEUE_CHUNKS_MAX)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_chunks, reader, send)
            nursery.start_soon(_write_chunks, receive, destination, holder, reset_connection, direction, source)
    except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        reset_connection()  # one side failed: the other sees it as a reset too


async def _proxy_connection(client: trio.SocketStream, target: tuple[str, int], holder: Holder, source: str) -> None:
    """Forward client (opened by the process with the command line source) to target under holder's settings."""
    # No handshake crosses a partition, whichever way it cuts: the target is not connected to until it heals.
    if not (await _held_while_partitioned(holder, "to_target", source)
            and await _held_while_partitioned(holder, "from_target", source)):
        abort(client)
        await client.aclose()
        return
    try:
        server = await trio.open_tcp_stream(*target)
    except OSError:
        abort(client)
        await client.aclose()
        return
    async with client, server:
        with trio.CancelScope() as connection:
            def reset_connection() -> None:
                abort(client)
                abort(server)
                connection.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(_forward, client, server, holder, reset_connection, "to_target", source)
                nursery.start_soon(_forward, server, client, holder, reset_connection, "from_target", source)


async def serve_proxy(listen: tuple[str, int], target: tuple[str, int], holder: Holder,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled with the settings holder holds at each chunk (a caller in process changes them at
    once); reports the port it listens on. Each connection's client process is looked up once, at accept, for
    partition_from."""
    async def handle(client: trio.SocketStream) -> None:
        await _proxy_connection(client, target, holder, await client_command_line(client))

    listeners = await trio.open_tcp_listeners(listen[1], host=listen[0])
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def run_proxy(listen: tuple[str, int], target: tuple[str, int], control: Path,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled with the settings of the control file; reports the port it listens on."""
    holder = Holder(LinkSettings())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow_control, control, lambda values: setattr(holder, "settings",
                                                                          settings_from(LinkSettings, values)))
        task_status.started(await nursery.start(serve_proxy, listen, target, holder))


# ---- slow_disk: a FUSE passthrough that delays fsync (benchmarks/slowfs.py)


def serve_slowfs(backing: Path, mountpoint: Path, control: Path) -> None:
    """Mount, serve until SIGTERM or SIGINT, unmount."""
    import pyfuse3

    operations = make_operations()(str(backing.resolve()))

    def apply(values: dict) -> None:
        settings = settings_from(DiskSettings, values)
        crash = settings.crash > operations.settings.crash
        operations.settings = settings
        print(f"slowfs: {operations.settings}", file=sys.stderr, flush=True)
        if crash:
            counts = {"crash": settings.crash, **operations.crash()}
            print(f"slowfs: crashed: {counts}", file=sys.stderr, flush=True)
            write_control(crashed_path(control), counts)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_control, control, apply)
            nursery.start_soon(terminate_on_signal, pyfuse3.terminate)
            await pyfuse3.main(min_tasks=4, max_tasks=64)
            nursery.cancel_scope.cancel()

    pyfuse3.init(operations, str(mountpoint), set(pyfuse3.default_options) | {"fsname=rocket-slowfs"})
    try:
        trio.run(main)
    except BaseException:
        pyfuse3.close(unmount=False)
        raise
    pyfuse3.close(unmount=True)


async def terminate_on_signal(terminate) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            terminate()
            return


def crashed_path(control: Path) -> Path:
    """Where slowfs says which crash it last carried out, and what it dropped."""
    return control.with_name(control.name + ".crashed")


def crash_slowfs(control: Path, timeout_s: float = MOUNT_WAIT_S) -> dict:
    """Make a lazy slowfs drop everything not fsynced (its control's crash counter goes up by one), and wait
    until it has: what it dropped, {"crash", "files_reverted", "bytes_dropped", "files_removed"}."""
    values = json.loads(control.read_text())
    if not values.get("lazy"):
        raise FaultError(f"{control} does not make slowfs lazy: a crash would drop nothing")
    values["crash"] = values.get("crash", 0) + 1
    write_control(control, values)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            counts = json.loads(crashed_path(control).read_text())
            if counts["crash"] >= values["crash"]:
                return counts
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    raise FaultError(f"slowfs did not carry out crash {values['crash']} within {timeout_s} s")


def start_proxy(listen: str, target: str, control: Path, log: Path) -> subprocess.Popen:
    """`faults.py proxy` from listen (HOST:PORT) to target, in a session of its own (it outlives the caller)."""
    with open(log, "ab") as output:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "proxy", listen, target, "--control",
                                 str(control)], stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                start_new_session=True)


def is_slowfs_mount(mountpoint: Path) -> bool:
    wanted = str(mountpoint.resolve()).replace(" ", "\\040")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, point, *_ = line.split()
        if point == wanted and device == "rocket-slowfs":
            return True
    return False


def start_slowfs(backing: Path, mountpoint: Path, control: Path, log: Path) -> subprocess.Popen:
    """`faults.py slowfs` in a session of its own (it outlives the caller), once its mount is there."""
    if is_slowfs_mount(mountpoint):
        raise FaultError(f"{mountpoint} is already a slowfs mount")
    with open(log, "ab") as output:
        process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "slowfs", str(backing),
                                    str(mountpoint), "--control", str(control)],
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True)
    deadline = time.monotonic() + MOUNT_WAIT_S
    while not is_slowfs_mount(mountpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = log.read_text(errors="replace")[-1000:]
            raise FaultError(f"slowfs did not mount {mountpoint} (exit {process.wait()}): {tail}")
        time.sleep(0.05)
    return process


def stop_process(pid: int) -> None:
    """SIGTERM, wait, SIGKILL: only the pid given, which this tool started."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not our child: poll for its exit
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def unmount(mountpoint: Path) -> None:
    """Lazily, so that a slowfs that died (the mount answering 'Transport endpoint is not connected') goes too."""
    if is_slowfs_mount(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


# ---- cpu: cgroup cpu.max (v2), or cpu.cfs_quota_us where cpu is bound to a v1 hierarchy


def _mounts(fstype: str) -> list[tuple[Path, set[str]]]:
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, kind, options, *_ = line.split()
        if kind == fstype:
            found.append((Path(point), set(options.split(","))))
    return found


def _cgroup_of(pid: int, v2: bool) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
            return path
    raise FaultError(f"process {pid} has no {'cgroup v2' if v2 else 'cpu cgroup v1'} entry in /proc/{pid}/cgroup")


@dataclass
class CpuThrottle:
    pid: int
    group: Path  # the cgroup the pid was moved to
    original: Path  # where it came from, and goes back to

    def release(self) -> None:
        try:
            (self.original / "cgroup.procs").write_text(str(self.pid))
        except ProcessLookupError:
            pass  # it exited while throttled
        except OSError as error:
            if error.errno != errno.ESRCH:
                raise
        self.group.rmdir()


def _cpu_root() -> tuple[Path, bool]:
    """The hierarchy that has the cpu controller, and whether it is v2."""
    for point, _ in _mounts("cgroup2"):
        controllers = (point / "cgroup.controllers").read_text().split()
        if "cpu" in controllers:
            return point, True
    for point, options in _mounts("cgroup"):
        if "cpu" in options:
            return point, False
    if not _mounts("cgroup2"):
        raise FaultError("cgroup v2 is not mounted (no cgroup2 in /proc/mounts), nor a v1 cpu hierarchy")
    raise FaultError("the cpu controller is in no cgroup hierarchy here (cgroup.controllers of the cgroup2 mount "
                     "lacks cpu, and no v1 cgroup is mounted with cpu)")


def throttle_cpu(pid: int, name: str, quota_us: int, period_us: int = CPU_PERIOD_US) -> CpuThrottle:
    """Move the process into CGROUP_PARENT/name with quota_us of CPU time per period_us."""
    if not (1000 <= quota_us and 1000 <= period_us <= 1_000_000):
        raise FaultError(f"cpu quota {quota_us} us per {period_us} us: both at least 1000 us, period at most 1 s")
    root, v2 = _cpu_root()
    original = root / _cgroup_of(pid, v2).lstrip("/")
    parent, group = root / CGROUP_PARENT, root / CGROUP_PARENT / name
    try:
        parent.mkdir(exist_ok=True)
        if v2:
            # The controller has to be enabled on the way down: in the root's and in the parent's subtree_control.
            for each in (root, parent):
                if "cpu" not in (each / "cgroup.subtree_control").read_text().split():
                    (each / "cgroup.subtree_control").write_text("+cpu")
        group.mkdir()
        if v2:
            (group / "cpu.max").write_text(f"{quota_us} {period_us}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        (group / "cgroup.procs").write_text(str(pid))
    except OSError as error:
        if group.exists():
            group.rmdir()
        raise FaultError(f"cannot throttle pid {pid} in {group}: {error.strerror or error}") from None
    return CpuThrottle(pid, group, original)


# ---- prepare, run, teardown on an examples/cluster base directory


def node_dir(base: Path, node: str) -> Path:
    if node not in NODE_IDS:
        raise FaultError(f"unknown node {node}; the cluster's nodes are {', '.join(NODE_IDS)}")
    return base / node


def node_pid(base: Path, node: str) -> int | None:
    try:
        pid = int((node_dir(base, node) / "node.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() and not _zombie(pid) else None


def prepare(base: Path, node: str, slow_disk: bool, proxy: bool, port_base: int) -> None:
    directory = node_dir(base, node)
    directory.mkdir(parents=True, exist_ok=True)
    if node_pid(base, node):
        raise FaultError(f"{node} is running; prepare before `cluster.sh start`")
    if slow_disk:
        data, backing = directory / "data", directory / "data.backing"
        if data.exists() and not backing.exists() and not is_slowfs_mount(data):
            data.rename(backing)  # an existing node keeps its data, now under slowfs
        backing.mkdir(exist_ok=True)
        data.mkdir(exist_ok=True)
        control = directory / "slowfs.json"
        write_control(control, {"factor": 1})
        process = start_slowfs(backing, data, control, directory / "slowfs.log")
        (directory / "slowfs.pid").write_text(f"{process.pid}\n")
        print(f"{node}: {data} is slowfs over {backing} (pid {process.pid}, control {control})")
    if proxy:
        node_port = port_base + NODE_IDS[node]
        proxy_port = node_port + PROXY_PORT_OFFSET
        control = directory / "proxy.json"
        write_control(control, {})
        process = start_proxy(f"127.0.0.1:{proxy_port}", f"127.0.0.1:{node_port}", control, directory / "proxy.log")
        (directory / "proxy.pid").write_text(f"{process.pid}\n")
        (directory / "node.env").write_text(f"{NODE_ENV_HEADER}ROCKET_ADVERTISE=127.0.0.1:{proxy_port}\n")
        print(f"{node}: proxy 127.0.0.1:{proxy_port} -> 127.0.0.1:{node_port} (pid {process.pid}, control {control});"
              f" {directory / 'node.env'} sets ROCKET_ADVERTISE=127.0.0.1:{proxy_port} (cluster.sh reads it)")


def teardown(base: Path) -> None:
    for node in NODE_IDS:
        directory = base / node
        if not directory.is_dir():
            continue
        if node_pid(base, node):
            raise FaultError(f"{node} still runs; run `cluster.sh stop {base}` first")
        for tool in ("proxy", "slowfs"):
            pid_file = directory / f"{tool}.pid"
            if pid_file.exists():
                stop_process(int(pid_file.read_text()))
                pid_file.unlink()
                print(f"{node}: stopped {tool}")
        unmount(directory / "data")
        env_file = directory / "node.env"
        if env_file.exists() and env_file.read_text().startswith(NODE_ENV_HEADER):
            env_file.unlink()


def fault_actions(base: Path, node: str, kind: str, severity: float, loss: bool = False):
    """(apply, remove, the settings applied) for one fault, checked now, before any waiting. loss: a link fault
    stalls severity percent of the chunks instead of delaying each by severity ms."""
    directory = node_dir(base, node)
    if loss and kind != "link":
        raise FaultError("--loss is a kind of link fault")
    if kind == "control":
        return (lambda: None), (lambda: None), {}
    if kind == "slow_disk":
        control = directory / "slowfs.json"
        if not is_slowfs_mount(directory / "data"):
            raise FaultError(f"{directory / 'data'} is not a slowfs mount; run `faults.py prepare --slow-disk` "
                             "before `cluster.sh start`")
        DiskSettings(factor=severity).check()
        return (lambda: write_control(control, {"factor": severity})), (lambda: write_control(control, {"factor": 1})), \
            {"factor": severity}
    if kind == "link":
        control = directory / "proxy.json"
        if not control.exists():
            raise FaultError(f"no proxy for {node} ({control} is missing); run `faults.py prepare --proxy` before "
                             "`cluster.sh start`")
        settings = {"loss": severity / 100} if loss else {"latency_ms": severity, "jitter_ms": severity / 5}
        settings_from(LinkSettings, settings)  # checks them
        return (lambda: write_control(control, settings)), (lambda: write_control(control, {})), settings
    if kind == "cpu":
        pid = node_pid(base, node)
        if pid is None:
            raise FaultError(f"{node} is not running (no live pid in {directory / 'node.pid'})")
        if severity < 1:
            raise FaultError("cpu severity is a slowdown factor, at least 1")
        throttles = []
        quota_us = int(CPU_PERIOD_US / severity)
        return (lambda: throttles.append(throttle_cpu(pid, node, quota_us))), \
            (lambda: [each.release() for each in throttles]), {"quota_us": quota_us, "period_us": CPU_PERIOD_US}
    raise FaultError(f"unknown kind {kind}; kinds: {', '.join(KINDS)}")


def now_ms() -> int:
    return int(time.time() * 1000)


def run(base: Path, node: str, kind: str, severity: float, after_s: float, for_s: float, labels: Path,
        loss: bool = False) -> dict:
    """Apply the fault after after_s for for_s, then append its label; an interrupt ends it early, labelled."""
    apply, remove, settings = fault_actions(base, node, kind, severity, loss)
    time.sleep(after_s)
    apply()
    start_ms = now_ms()
    print(f"{kind} on {node}, severity {severity} ({json.dumps(settings)}), for {for_s} s", flush=True)
    try:
        time.sleep(for_s)
    finally:
        remove()
        label = {"kind": kind, "node": node, "node_id": NODE_IDS.get(node, 0), "severity": severity,
                 "start_ms": start_ms, "end_ms": now_ms(), "fault": settings}
        with open(labels, "a") as file:
            file.write(json.dumps(label) + "\n")
        print(f"label: {json.dumps(label)}", flush=True)
    return label


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    slowfs = commands.add_parser("slowfs", help="mount BACKING at MOUNTPOINT with slow fsyncs, until SIGTERM")
    slowfs.add_argument("backing", type=Path)
    slowfs.add_argument("mountpoint", type=Path)
    slowfs.add_argument("--control", type=Path, required=True, help='JSON: {"factor": N, "write_delay_ms": W}')
    proxy = commands.add_parser("proxy", help="forward LISTEN to TARGET with link faults, until SIGTERM")
    proxy.add_argument("listen", type=parse_address)
    proxy.add_argument("target", type=parse_address)
    proxy.add_argument("--control", type=Path, required=True,
                       help='JSON: {"latency_ms", "jitter_ms", "loss", "bandwidth_bytes_per_s", "reset", "partition", '
                            '"partition_mode", "partition_from": [substrings of the cut clients\' command lines]}')
    prepare_command = commands.add_parser("prepare", help="before cluster.sh start: slowfs and/or proxy for a node")
    prepare_command.add_argument("--base", type=Path, required=True)
    prepare_command.add_argument("--node", required=True, choices=NODE_IDS)
    prepare_command.add_argument("--slow-disk", action="store_true")
    prepare_command.add_argument("--proxy", action="store_true")
    prepare_command.add_argument("--port-base", type=int, default=int(os.environ.get("PORT_BASE", "9100")),
                                 help="the PORT_BASE cluster.sh will start with (default: $PORT_BASE or 9100)")
    run_command = commands.add_parser("run", help="one fault on a running node, then its label")
    run_command.add_argument("--base", type=Path, required=True)
    run_command.add_argument("--node", required=True, choices=NODE_IDS)
    run_command.add_argument("--kind", required=True, choices=KINDS)
    run_command.add_argument("--severity", type=float, required=True)
    run_command.add_argument("--loss", action="store_true",
                             help="link only: severity is the percentage of chunks stalled as lost, not latency in ms")
    run_command.add_argument("--after-s", type=float, default=0.0)
    run_command.add_argument("--for-s", type=float, required=True)
    run_command.add_argument("--labels", type=Path, required=True, help="JSON-lines file the label is appended to")
    teardown_command = commands.add_parser("teardown", help="after cluster.sh stop: stop proxies, unmount slowfs")
    teardown_command.add_argument("--base", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "slowfs":
            serve_slowfs(args.backing, args.mountpoint, args.control)
        elif args.command == "proxy":
            trio.run(_proxy_main, args.listen, args.target, args.control)
        elif args.command == "prepare":
            if not (args.slow_disk or args.proxy):
                parser.error("prepare: give --slow-disk, --proxy or both")
            prepare(args.base.resolve(), args.node, args.slow_disk, args.proxy, args.port_base)
        elif args.command == "run":
            run(args.base.resolve(), args.node, args.kind, args.severity, args.after_s, args.for_s, args.labels,
                args.loss)
        else:
            teardown(args.base.resolve())
    except FaultError as error:
        print(f"faults: {error}", file=sys.stderr)
        return 1
    return 0


async def _proxy_main(listen, target, control: Path) -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(run_proxy, listen, target, control)
        print(f"proxy 127.0.0.1:{port} -> {target[0]}:{target[1]}", file=sys.stderr, flush=True)
        await terminate_on_signal(nursery.cancel_scope.cancel)


if __name__ == "__main__":
    sys.exit(main())
