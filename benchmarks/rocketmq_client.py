"""The official RocketMQ 5 Python client (gRPC) and the Node.js remoting client ali-ons against rocket, beside
rocket's own client, in one run: one `rocket run` process on 127.0.0.1; the official Producer sends N messages
one at a time (its send is synchronous) and its SimpleConsumer receives and acks them (batches of 32, one ack
call per message, as that client offers); ali-ons (tests/node/aons.js, installed with
`npm ci --prefix tests/node`; skipped without it) sends N one at a time (awaiting each) and its push consumer
consumes them, timed from its first output line to its last; then rocket's own Producer and SimpleConsumer do the
same over TCP, one awaited send at a time and also pipelined (rocket's producer batches), and receive with one
ack call per batch.

    python benchmarks/rocketmq_client.py [--messages 2000] [--size 256] [--senders 64] [--out DIR]

With --senders N, the official client keeps N sends outstanding (send_async) and ali-ons runs N senders at once
(aons.js --senders): the shape in which a gateway's one-message send meets the server's per-request cost.

Prints messages/s for each and writes benchmarks/results/rocketmq-client.json. The official client runs in
its own process (it configures logging globally).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import trio

from rocket.client import SimpleConsumer, connect, open_producer
from rocket.model import Message

RESULTS = Path(__file__).parent / "results"
READY = re.compile(rb"rocket ready tcp=[^:]+:(\d+) http2=(?:[^: ]+:)?(\d+)")

OFFICIAL = textwrap.dedent("""
    import json, sys, time
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    from concurrent.futures import FIRST_COMPLETED, wait
    endpoint, topic, count, size, senders = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,))
    producer.startup()
    body = b"x" * size
    started = time.perf_counter()
    pending = set()
    for _ in range(count):
        message = Message()
        message.topic, message.body = topic, body
        if senders == 1:
            producer.send(message)
            continue
        if len(pending) >= senders:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
        pending.add(producer.send_async(message))
    for future in pending:
        future.result()
    send_s = time.perf_counter() - started
    producer.shutdown()
    consumer = SimpleConsumer(config, "bench-official", {topic: FilterExpression()}, 30)
    consumer.startup()
    received, started = 0, time.perf_counter()
    while received < count:
        for got in consumer.receive(32, 10):
            consumer.ack(got)
            received += 1
    receive_s = time.perf_counter() - started
    consumer.shutdown()
    print("RESULT " + json.dumps({"send_s": send_s, "receive_s": receive_s}), flush=True)
""")


NODE_DRIVER = Path(__file__).parent.parent / "tests" / "node" / "aons.js"


def ali_ons(server: str, topic: str, count: int, size: int, senders: int = 1) -> dict | None:
    """Seconds from ali-ons' first acknowledged send to its last, and from its first consumed message to its
    last, or None without node and the driver's packages."""
    node = shutil.which("node")
    if node is None or not (NODE_DRIVER.parent / "node_modules" / "ali-ons").is_dir():
        return None
    timings = {}
    for phase, arguments in (("send_s", ["produce", "--count", str(count), "--body-prefix", "x" * size,
                                         "--senders", str(senders)]),
                             ("receive_s", ["consume", "--group", "bench-aons", "--from", "first", "--count",
                                            str(count), "--timeout-s", "900"])):
        process = subprocess.Popen([node, str(NODE_DRIVER), *arguments, "--namesrv", server, "--topic", topic],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first = last = None
        lines = 0
        for line in process.stdout:
            if line.startswith('{"body"'):
                last = time.perf_counter()
                first = first or last
                lines += 1
        process.wait()
        if lines < count or first is None:
            raise SystemExit(f"ali-ons {phase}: {lines} of {count} messages")
        timings[phase] = (last - first) * count / max(1, count - 1)
    return timings


async def rocket_client(server: str, topic: str, count: int, size: int) -> dict:
    body = b"x" * size
    async with connect(server) as channel:
        async with open_producer(channel, topic) as producer:
            started = time.perf_counter()
            for _ in range(count):
                await producer.send(Message(body))
            one_by_one_s = time.perf_counter() - started
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(producer.send, Message(body))
            pipelined_s = time.perf_counter() - started
        consumer = SimpleConsumer(channel, topic, "bench-rocket", invisible_s=30)
        received, started = 0, time.perf_counter()
        while received < 2 * count:
            messages = await consumer.receive(32, 10)
            if messages:
                await consumer.ack(*messages)
            received += len(messages)
        receive_s = time.perf_counter() - started
    return {"send_one_by_one_s": one_by_one_s, "send_pipelined_s": pipelined_s, "receive_s": receive_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--senders", type=int, default=1, help="sends outstanding at once (official client, ali-ons)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    arguments = parser.parse_args()
    count, size = arguments.messages, arguments.size
    directory = Path(tempfile.mkdtemp(prefix="rocket-rmq-bench-"))
    process = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(directory / "node"),
                                "--listen", "127.0.0.1:0", "--http2-listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=open(directory / "server.log", "wb"))
    try:
        match = None
        while match is None:
            line = process.stdout.readline()
            if not line:
                raise SystemExit(f"rocket run exited: {(directory / 'server.log').read_text()[-2000:]}")
            match = READY.search(line)
        server, endpoint = f"127.0.0.1:{int(match.group(1))}", f"127.0.0.1:{int(match.group(2))}"
        for topic in ("bench-official", "bench-rocket", "bench-remoting"):
            subprocess.run([sys.executable, "-m", "rocket", "topic", "create", topic, "--queues", "8", "--server",
                            server], check=True, capture_output=True)
        completed = subprocess.run([sys.executable, "-c", OFFICIAL, endpoint, "bench-official", str(count), str(size),
                                    str(arguments.senders)],
                                   capture_output=True, text=True, timeout=1800)
        lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"official client failed: {completed.stderr[-3000:]}")
        official = json.loads(lines[0][len("RESULT "):])
        remoting = ali_ons(server, "bench-remoting", count, size, arguments.senders)
        own = trio.run(rocket_client, server, "bench-rocket", count, size)
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/rocketmq_client.py", *sys.argv[1:]]),
        "messages": count, "message_bytes": size, "senders": arguments.senders,
        "official_send_per_s": count / official["send_s"], "official_receive_ack_per_s": count / official["receive_s"],
        "ali_ons_send_per_s": count / remoting["send_s"] if remoting else None,
        "ali_ons_consume_per_s": count / remoting["receive_s"] if remoting else None,
        "rocket_send_one_by_one_per_s": count / own["send_one_by_one_s"],
        "rocket_send_pipelined_per_s": count / own["send_pipelined_s"],
        "rocket_receive_ack_per_s": 2 * count / own["receive_s"],
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "rocketmq-client.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
