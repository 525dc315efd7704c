"""rocket against real peers, one command: starts each system on 127.0.0.1 with its data in a temporary
directory, runs the same workloads on each from Python clients, stops it, and writes JSON, a markdown table
and a PNG chart. Every system's figures sit beside the raw durable bandwidth of the same disk, probed just before.

    python benchmarks/run.py --messages 200000,20000 --sizes 1024,16384 --producers 1,8 \
        --systems rocket,nats,redis-always,redis-everysec,rabbitmq --out benchmarks/results/compare [--profile]

Workloads, for each message size: produce only (with each producer count), consume only (what the first
produce wrote; for rocket also as bodies only, `consume:bodies`), produce and consume at once, and produce at a fixed rate (half what the system reached with the
first producer count) for latency.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers.py and produce.py beside this file

from peers import SYSTEMS, System, find_binary  # noqa: E402

from rocket.cli.disk_probe import raw_disk_bandwidth, raw_disk_bandwidth_direct  # noqa: E402
from rocket.client.bench import percentile  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
READ_TIMEOUT_S = 120.0  # a reader that has not seen every message by then reports what it got
RATE_TICK_S = 0.002  # a fixed-rate producer sends what fell due every tick, as one batch
RATE_IN_FLIGHT_MAX = 256  # batches a fixed-rate producer may have unacknowledged; past it, it waits (and latency shows it)


def batch_messages(size: int, batch_bytes: int) -> int:
    return max(1, batch_bytes // size)


def summarize(latencies_s: list[float]) -> dict:
    return {f"latency_ms_{name}": round(percentile(latencies_s, rank) * 1000, 3)
            for name, rank in (("p50", 50), ("p99", 99), ("p999", 99.9))}


def shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


class Start:
    """Producers open their connections, then wait here, so that the clock starts once all are connected."""

    def __init__(self, parties: int):
        self.missing = parties
        self.event = anyio.Event()
        self.at = 0.0

    async def arrive(self) -> None:
        self.missing -= 1
        if self.missing == 0:
            self.at = time.perf_counter()
            self.event.set()
        await self.event.wait()


async def produce(system: System, stream: str, *, messages: int, size: int, producers: int, batch_bytes: int,
                  in_flight: int) -> dict:
    """As fast as it goes: each producer keeps in_flight batches of batch_bytes unacknowledged."""
    body = os.urandom(size)
    per_batch = batch_messages(size, batch_bytes)
    prepared = {count: system.prepare(stream, count, body)
                for count in {per_batch} | {share % per_batch for share in shares(messages, producers)} if count}
    latencies: list[float] = []
    start = Start(producers)

    async def one_producer(share: int) -> None:
        async with system.producer(stream) as sender:
            window = anyio.Semaphore(in_flight)

            async def send(batch) -> None:
                sent_at = time.perf_counter()
                try:
                    await sender.send(batch)
                finally:
                    window.release()
                latencies.append(time.perf_counter() - sent_at)

            await start.arrive()
            async with anyio.create_task_group() as group:
                for first in range(0, share, per_batch):
                    await window.acquire()
                    group.start_soon(send, prepared[min(per_batch, share - first)])

    async with anyio.create_task_group() as group:
        for share in shares(messages, producers):
            group.start_soon(one_producer, share)
    seconds = time.perf_counter() - start.at
    return {"messages": messages, "seconds": round(seconds, 4), "messages_per_s": round(messages / seconds),
            "mb_per_s": round(messages * size / seconds / 1e6, 2), "batch_messages": per_batch,
            **summarize(latencies), "latency_of": "a batch, from send to acknowledgement"}


async def produce_at_rate(system: System, stream: str, *, rate_per_s: float, messages: int, size: int,
                          producers: int) -> dict:
    """Producers share the rate; each sends its message i at start + i / its rate, and what fell due in a tick
    goes as one batch. A message's latency runs from its due time to its acknowledgement, so a server that
    falls behind is not excused (no coordinated omission)."""
    body = os.urandom(size)
    rate_each_per_s = rate_per_s / producers
    per_tick = max(1, round(rate_each_per_s * RATE_TICK_S))
    prepared = {count: system.prepare(stream, count, body)
                for count in {per_tick} | {share % per_tick for share in shares(messages, producers)} if count}
    latencies: list[float] = []
    start = Start(producers)

    async def one_producer(share: int) -> None:
        acknowledged: list[tuple[float, int, int]] = []  # (time, first index, end index)
        async with system.producer(stream) as sender:
            window = anyio.Semaphore(RATE_IN_FLIGHT_MAX)

            async def send(batch, first: int, end: int) -> None:
                try:
                    await sender.send(batch)
                finally:
                    window.release()
                acknowledged.append((time.perf_counter(), first, end))

            await start.arrive()
            async with anyio.create_task_group() as group:
                sent = 0
                while sent < share:
                    count = min(per_tick, share - sent)
                    wait_s = start.at + (sent + count - 1) / rate_each_per_s - time.perf_counter()
                    if wait_s > 0:
                        await anyio.sleep(wait_s)
                    await window.acquire()
                    group.start_soon(send, prepared[count], sent, sent + count)
                    sent += count
        latencies.extend(at - start.at - index / rate_each_per_s
                         for at, first, end in acknowledged for index in range(first, end))

    async with anyio.create_task_group() as group:
        for share in shares(messages, producers):
            group.start_soon(one_producer, share)
    seconds = time.perf_counter() - start.at
    return {"messages": messages, "target_messages_per_s": round(rate_per_s), "messages_per_s": round(messages / seconds),
            "mb_per_s": round(messages * size / seconds / 1e6, 2), "seconds": round(seconds, 4),
            "batch_messages": per_tick, **summarize(latencies),
            "latency_of": "a message, from its due time to its acknowledgement"}


async def create(system: System, stream: str) -> None:
    await system.create(stream)


async def consume(system: System, stream: str, *, messages: int, size: int, bodies: bool = False) -> dict:
    received, payload, seconds = await (system.read(stream, messages, READ_TIMEOUT_S, bodies=True) if bodies
                                        else system.read(stream, messages, READ_TIMEOUT_S))
    return {"messages": received, "expected_messages": messages, "seconds": round(seconds, 4),
            "messages_per_s": round(received / seconds), "mb_per_s": round(payload / seconds / 1e6, 2)}


async def produce_and_consume(system: System, stream: str, *, messages: int, size: int, batch_bytes: int,
                              in_flight: int) -> dict:
    """One producer and one reader on a new stream at once, both started together; each rate is over its own
    time (the reader's from its first request, once set up)."""
    await system.create(stream)
    outcome = {}

    async def producing() -> None:
        outcome["produce"] = await produce(system, stream, messages=messages, size=size, producers=1,
                                           batch_bytes=batch_bytes, in_flight=in_flight)

    async def reading() -> None:
        outcome["consume"] = await consume(system, stream, messages=messages, size=size)

    async with anyio.create_task_group() as group:
        group.start_soon(reading)
        group.start_soon(producing)
    return outcome


def run_async(system: System, function, *args, **options):
    return anyio.run(functools.partial(function, system, *args, **options), backend=system.backend)


def start_profiler(pid: int, svg: Path) -> subprocess.Popen | None:
    py_spy = find_binary("py-spy")
    if py_spy is None:
        print("--profile: py-spy is not installed (pip install py-spy): no flame graph", file=sys.stderr)
        return None
    # --nonblocking: sampling without stopping the server, so the profiled run's latencies stay close to the truth.
    profiler = subprocess.Popen([py_spy, "record", "--nonblocking", "-o", str(svg), "--pid", str(pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let it attach before the run starts
    return profiler


def stop_profiler(profiler: subprocess.Popen | None) -> None:
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)
        profiler.wait(60)


def run_system(system: System, arguments, directory: Path, profile: bool) -> list[dict]:
    """Every workload of every size on one started system; returns one record per run."""
    runs = []

    def record(workload: str, size: int, producers: int, result: dict) -> dict:
        runs.append({"workload": workload, "message_bytes": size, "producers": producers, **result})
        print(f"  {system.name:15} {workload:16} {size:6} B x{producers}: "
              f"{result.get('mb_per_s', '-')} MB/s, {result.get('messages_per_s', '-')} msg/s"
              + (f", p50/p99/p999 {result['latency_ms_p50']}/{result['latency_ms_p99']}/{result['latency_ms_p999']} ms"
                 if "latency_ms_p50" in result else ""), flush=True)
        return runs[-1]

    def probe(workload: str, size: int, messages: int, direct: bool = False) -> float:
        measure = raw_disk_bandwidth_direct if direct else raw_disk_bandwidth
        raw = measure(directory / "raw-disk-probe", messages * size, seconds_max=60.0)
        if raw is None:
            return 0.0  # no O_DIRECT on this file system: no row, and no ratio to it
        record(workload, size, 1, {"mb_per_s": round(raw["mb_per_s"], 2), "seconds": round(raw["seconds"], 4),
                                   "bytes": raw["bytes"], "fdatasync_ms_p50": round(raw["fdatasync_ms_p50"], 3)})
        return raw["mb_per_s"]

    for size, messages in zip(arguments.sizes, arguments.messages):
        # The probe's speed depends on the page cache as much as on the disk: a write into a page the host took
        # back (virtio-balloon free page reporting) costs a host fault (benchmarks/disk_modes.py). Before the
        # runs it often gets pages the previous system's deleted data just freed; after them, fresh ones.
        before = probe("raw-disk", size, messages)
        # With wal_direct_io, rocket's WAL writes with O_DIRECT, which takes no page-cache page: probe that way too.
        direct = probe("raw-disk:direct", size, messages, direct=True)
        produced = []
        first_stream = None
        peak_per_s = 0
        for producers in arguments.producers:
            stream = f"bench-{size}-p{producers}-{uuid.uuid4().hex[:8]}"
            run_async(system, create, stream)
            profiler = None
            if profile and system.name == "rocket" and first_stream is None:
                profiler = start_profiler(system.server_pid, Path(f"{arguments.out}-rocket-produce-{size}.svg"))
            try:
                result = run_async(system, produce, stream, messages=messages, size=size, producers=producers,
                                   batch_bytes=arguments.batch_bytes, in_flight=arguments.in_flight)
            finally:
                stop_profiler(profiler)
            result["ratio_to_raw_disk"] = round(result["mb_per_s"] / before, 3) if before else None
            result["ratio_to_raw_disk_direct"] = round(result["mb_per_s"] / direct, 3) if direct else None
            produced.append(record("produce", size, producers, result))
            if producers == arguments.producers[0]:
                peak_per_s = result["messages_per_s"]
            first_stream = first_stream or stream
        after = probe("raw-disk:after", size, messages)
        for run in produced:
            run["ratio_to_raw_disk_after"] = round(run["mb_per_s"] / after, 3) if after else None
        profiler = None
        if profile and system.name == "rocket":
            # Reading, the client is what is busy (about a core) and the server is not: this profiles the harness's
            # own process, where rocket's consumer decodes.
            profiler = start_profiler(os.getpid(), Path(f"{arguments.out}-rocket-consume-{size}-client.svg"))
        try:
            result = run_async(system, consume, first_stream, messages=messages, size=size)
        finally:
            stop_profiler(profiler)
        record("consume", size, arguments.producers[0], result)
        if system.reads_bodies:
            record("consume:bodies", size, arguments.producers[0],
                   run_async(system, consume, first_stream, messages=messages, size=size, bodies=True))
        both = run_async(system, produce_and_consume, f"bench-{size}-both-{uuid.uuid4().hex[:8]}", messages=messages,
                         size=size, batch_bytes=arguments.batch_bytes, in_flight=arguments.in_flight)
        record("both:produce", size, 1, both["produce"])
        record("both:consume", size, 1, both["consume"])
        rate_per_s = peak_per_s * arguments.rate_fraction
        rate_messages = max(1, min(messages, math.ceil(rate_per_s * arguments.rate_seconds)))
        stream = f"bench-{size}-rate-{uuid.uuid4().hex[:8]}"
        run_async(system, create, stream)
        profiler = None
        if profile and system.name == "rocket":
            profiler = start_profiler(system.server_pid, Path(f"{arguments.out}-rocket-fixed-rate-{size}.svg"))
        try:
            result = run_async(system, produce_at_rate, stream, rate_per_s=rate_per_s, messages=rate_messages,
                               size=size, producers=arguments.producers[0])
        finally:
            stop_profiler(profiler)
        record("fixed-rate", size, arguments.producers[0], result)
    return runs


def package_version(package: str) -> str | None:
    if shutil.which("dpkg-query") is None:
        return None
    answer = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return answer.stdout.strip() or None


def system_version(system: System) -> str | None:
    if system.name == "rocket":
        import rocket

        source = Path(rocket.__file__).resolve().parent
        answer = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=source)
        if answer.returncode != 0:
            return f"source {source} (not a git checkout)"
        changed = subprocess.run(["git", "status", "--porcelain", "."], capture_output=True, text=True, cwd=source)
        return f"commit {answer.stdout.strip()}" + (" with uncommitted changes" if changed.stdout.strip() else "")
    return package_version(system.packages[0])


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    memory_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal")), 0) if Path("/proc/meminfo").exists() else 0
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(memory_kib / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version()}


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", default="200000",
                        help="messages per run: one number, or one per size (e.g. 200000,20000)")
    parser.add_argument("--sizes", default="1024,16384", help="message body bytes, comma-separated")
    parser.add_argument("--producers", default="1,8", help="concurrent producers, comma-separated")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"any of {', '.join(SYSTEMS)}")
    parser.add_argument("--out", default=str(RESULTS / "compare"), help="writes OUT.json, OUT.md and OUT.png")
    parser.add_argument("--batch-bytes", type=int, default=1 << 20, help="bytes of messages per batch (pipeline)")
    parser.add_argument("--in-flight", type=int, default=4, help="unacknowledged batches per producer")
    parser.add_argument("--rate-fraction", type=float, default=0.5, help="fixed rate as a fraction of the peak")
    parser.add_argument("--rate-seconds", type=float, default=10.0, help="longest fixed-rate run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all systems; tables show the median run")
    parser.add_argument("--profile", action="store_true", help="py-spy flame graphs: the rocket server in produce and fixed-rate runs, the client in consume")
    parser.add_argument("--data-parent", default=None, help="a directory on the disk under test (default: the temporary directory)")
    arguments = parser.parse_args(argv)
    arguments.sizes = [int(each) for each in arguments.sizes.split(",")]
    arguments.producers = [int(each) for each in arguments.producers.split(",")]
    counts = [int(each) for each in arguments.messages.split(",")]
    if len(counts) == 1:
        counts = counts * len(arguments.sizes)
    if len(counts) != len(arguments.sizes):
        parser.error("--messages takes one number or one per size")
    arguments.messages = counts
    arguments.systems = parse_systems(parser, arguments.systems, SYSTEMS)
    return arguments


def parse_systems(parser: argparse.ArgumentParser, text: str, known) -> list[str]:
    """--systems a,b: the names, each one of known, else a usage error listing them."""
    systems = [each.strip() for each in text.split(",") if each.strip()]
    unknown = [each for each in systems if each not in known]
    if unknown:
        parser.error(f"unknown systems {', '.join(unknown)}; known: {', '.join(known)}")
    return systems


def main(argv=None) -> None:
    arguments = parse_arguments(argv)
    out = Path(arguments.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(["python", "benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {"messages": arguments.messages, "sizes": arguments.sizes, "producers": arguments.producers,
                     "batch_bytes": arguments.batch_bytes, "in_flight_per_producer": arguments.in_flight,
                     "rate_fraction": arguments.rate_fraction, "rate_seconds_max": arguments.rate_seconds,
                     "rounds": arguments.rounds},
        "systems": {},
    }
    for name in arguments.systems:
        system = SYSTEMS[name]
        entry = report["systems"][name] = {"durability": system.durability, "version": system_version(system)}
        reason = system.missing()
        if reason:
            entry["skipped"] = reason
            print(f"{name}: skipped, {reason}", flush=True)
        else:
            entry["runs"], entry["start_seconds"] = [], []
    # Rounds go through every system in turn, so that a slow minute of the disk hits one round of each.
    for number in range(1, arguments.rounds + 1):
        for name, entry in report["systems"].items():
            if "runs" in entry:
                runs = measure(SYSTEMS[name], arguments, entry, profile=arguments.profile and number == 1)
                entry["runs"] += [{"round": number, **run} for run in runs]
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    chart(report, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def measure(system: System, arguments, entry: dict, profile: bool) -> list[dict]:
    """Start the system on a new temporary directory, run every workload, stop it, remove the directory."""
    directory = Path(tempfile.mkdtemp(prefix=f"rocket-compare-{system.name}-", dir=arguments.data_parent))
    try:
        started = time.perf_counter()
        system.start(directory)
        entry["start_seconds"].append(round(time.perf_counter() - started, 2))
        print(f"{system.name}: started in {entry['start_seconds'][-1]} s ({system.durability})", flush=True)
        try:
            return run_system(system, arguments, directory, profile)
        finally:
            system.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def figures(report: dict, number: int | None = None) -> dict:
    """(system, workload, size, producers) -> the run of round `number`, or over all rounds the run with the
    median MB/s (a real run, so its figures belong together)."""
    grouped: dict[tuple, list[dict]] = {}
    for name, entry in report["systems"].items():
        for run in entry.get("runs", []):
            if number is None or run["round"] == number:
                grouped.setdefault((name, run["workload"], run["message_bytes"], run["producers"]), []).append(run)
    return {key: sorted(runs, key=lambda run: run["mb_per_s"])[(len(runs) - 1) // 2] for key, runs in grouped.items()}


def markdown(report: dict) -> str:
    table = figures(report)
    names = [name for name, entry in report["systems"].items() if "runs" in entry]
    machine_text = report["machine"]
    lines = [
        f"# rocket against its peers, {report['date']}", "",
        f"`{report['command']}`", "",
        f"Machine: {machine_text['cpus']} CPUs ({machine_text['cpu_model']}), {machine_text['memory_gib']} GiB, "
        f"Linux {machine_text['kernel']}, Python {machine_text['python']}. Clients and servers share the machine. "
        f"Settings: {json.dumps(report['settings'])}.", "",
        "| system | version | durability (what an acknowledgement means) |", "|---|---|---|",
    ]
    for name, entry in report["systems"].items():
        lines.append(f"| {name} | {entry.get('version') or '-'} | {entry['durability']}"
                     + (f" — **skipped: {entry['skipped']}**" if "skipped" in entry else "") + " |")
    rounds = report["settings"]["rounds"]
    median = f"the median run of {rounds} rounds" if rounds > 1 else "one round"
    lines += ["", f"Throughput, MB/s of message bodies (thousands of messages/s), {median}. Raw disk: 1 MiB `write` + "
              "`fdatasync`, as many bytes as the workload, probed on the same disk just before each system's runs "
              "(`raw-disk:direct`: the same with `O_DIRECT`, right after; `raw-disk:after`: after the produce runs).", ""]
    lines += ["| workload | size | producers | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    rows = sorted({key[1:] for key in table}, key=lambda key: (key[1], _workload_order(key[0]), key[2]))
    for workload, size, producers in rows:
        cells = []
        for name in names:
            run = table.get((name, workload, size, producers))
            if run is None:
                cells.append("-")
            elif workload.startswith("raw-disk"):
                cells.append(f"{run['mb_per_s']:.1f}")
            else:
                cells.append(f"{run['mb_per_s']:.1f} ({run['messages_per_s'] / 1000:.1f}k)")
        lines.append(f"| {workload} | {size} | {producers} | " + " | ".join(cells) + " |")
    lines += ["", f"Latency, ms p50 / p99 / p999, {median}. `produce`: per batch at full speed; `fixed-rate`: per message at "
              f"{report['settings']['rate_fraction']:.0%} of the system's produce rate with as many producers, from its due "
              "time.", ""]
    lines += ["| workload | size | producers | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for workload, size, producers in rows:
        if workload not in ("produce", "fixed-rate"):
            continue
        cells = []
        for name in names:
            run = table.get((name, workload, size, producers))
            cells.append("-" if run is None else
                         f"{run['latency_ms_p50']:.1f} / {run['latency_ms_p99']:.1f} / {run['latency_ms_p999']:.1f}"
                         + (f" at {run['target_messages_per_s'] / 1000:.1f}k/s" if workload == "fixed-rate" else ""))
        lines.append(f"| {workload} | {size} | {producers} | " + " | ".join(cells) + " |")
    if "rocket" in names:
        lines += ["", f"Ratios of those figures ({median}): rocket's MB/s over each one's (raw disk: rocket over the "
                  "probe before its runs, the O_DIRECT one right after it, and the one after its produce runs, in the "
                  "same round).", ""]
        others = [name for name in names if name != "rocket"]
        lines += ["| workload | size | producers | raw disk before | raw disk direct | raw disk after | "
                  + " | ".join(others) + " |", "|---|---|---|---|---|---|" + "---|" * len(others)]
        for workload, size, producers in rows:
            rocket = table.get(("rocket", workload, size, producers))
            if rocket is None or workload.startswith("raw-disk") or workload in ("fixed-rate", "consume:bodies"):
                continue  # consume:bodies: rocket only
            cells = [f"{rocket[key]:.2f}" if rocket.get(key) is not None else "-"
                     for key in ("ratio_to_raw_disk", "ratio_to_raw_disk_direct", "ratio_to_raw_disk_after")]
            for name in others:
                run = table.get((name, workload, size, producers))
                cells.append(f"{rocket['mb_per_s'] / run['mb_per_s']:.2f}x" if run and run["mb_per_s"] else "-")
            lines.append(f"| {workload} | {size} | {producers} | " + " | ".join(cells) + " |")
        consume_over_produce = []
        for workload, size, producers in rows:
            produced = table.get(("rocket", "produce", size, producers))
            if workload.startswith("consume") and produced:
                ratio = table[("rocket", workload, size, producers)]["mb_per_s"] / produced["mb_per_s"]
                consume_over_produce.append(f"{workload} {size} B: {ratio:.2f}")
        lines += ["", "rocket's consume over its produce (same producer count; `consume:bodies` reads bodies only, with "
                  "`Consumer.poll_bodies`; every peer is read through its client's messages): " + ", ".join(consume_over_produce)]
        lines += rounds_table(report, names)
    return "\n".join(lines) + "\n"


def rounds_table(report: dict, names: list[str]) -> list[str]:
    """The targets' ratios within each round: rocket's produce over the raw disk and over each peer, and
    rocket's consume over its produce."""
    producers = report["settings"]["producers"][0]
    others = [name for name in names if name != "rocket"]
    lines = ["", f"Within each round, produce with {producers} producer(s): rocket MB/s, the raw disk probed before "
             "(buffered, then O_DIRECT) and after its produce runs and its ratio to each, its ratio to each peer, "
             "and its consume over its produce.", "",
             "| round | size | rocket MB/s | raw disk before / direct / after MB/s | rocket / raw before / direct / after | "
             + " | ".join(f"rocket / {name}" for name in others) + " | consume / produce | consume:bodies / produce |",
             "|---|---|---|---|---|" + "---|" * len(others) + "---|---|"]
    for number in range(1, report["settings"]["rounds"] + 1):
        table = figures(report, number)
        for size in report["settings"]["sizes"]:
            rocket = table.get(("rocket", "produce", size, producers))
            raw = table.get(("rocket", "raw-disk", size, 1))
            after = table.get(("rocket", "raw-disk:after", size, 1), {}).get("mb_per_s")
            direct = table.get(("rocket", "raw-disk:direct", size, 1), {}).get("mb_per_s")
            if rocket is None or raw is None:
                continue
            cells = [f"{rocket['mb_per_s'] / table[(name, 'produce', size, producers)]['mb_per_s']:.2f}x"
                     if (name, "produce", size, producers) in table else "-" for name in others]
            for workload in ("consume", "consume:bodies"):
                consumed = table.get(("rocket", workload, size, producers))
                cells.append(f"{consumed['mb_per_s'] / rocket['mb_per_s']:.2f}" if consumed else "-")
            probes = [raw["mb_per_s"], direct, after]
            lines.append(f"| {number} | {size} | {rocket['mb_per_s']:.1f} | "
                         + " / ".join(f"{each:.1f}" if each else "-" for each in probes) + " | "
                         + " / ".join(f"{rocket['mb_per_s'] / each:.2f}" if each else "-" for each in probes)
                         + " | " + " | ".join(cells) + " |")
    return lines


def _workload_order(workload: str) -> int:
    return ["raw-disk", "raw-disk:direct", "produce", "raw-disk:after", "consume", "consume:bodies", "both:produce",
            "both:consume", "fixed-rate"].index(workload)


def chart(report: dict, png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plot
    except ImportError:
        print(f"matplotlib is not installed (pip install matplotlib, or pip install -e '.[bench]'): no chart, "
              f"{png} not written", file=sys.stderr)
        return
    table = figures(report)
    names = [name for name, entry in report["systems"].items() if "runs" in entry]
    rows = sorted({key[1:] for key in table if not key[1].startswith("raw-disk") and key[1] != "fixed-rate"},
                  key=lambda key: (key[1], _workload_order(key[0]), key[2]))
    sizes = sorted({key[2] for key in table})
    figure, (throughput, latency) = plot.subplots(2, 1, figsize=(max(10, 1.4 * len(rows)), 10))
    width = 0.8 / max(1, len(names))
    for position, name in enumerate(names):
        values = [table.get((name, *row), {}).get("mb_per_s", 0) for row in rows]
        throughput.bar([index + position * width for index in range(len(rows))], values, width, label=name)
    raw = [table.get((names[0], "raw-disk", row[1], 1), {}).get("mb_per_s", 0) if names else 0 for row in rows]
    throughput.scatter([index + 0.4 - width / 2 for index in range(len(rows))], raw, marker="_", s=600, color="black",
                       label=f"raw disk (probe before {names[0] if names else ''})", zorder=3)
    throughput.set_xticks([index + 0.4 - width / 2 for index in range(len(rows))])
    throughput.set_xticklabels([f"{workload}\n{size} B x{producers}" for workload, size, producers in rows], fontsize=8)
    throughput.set_ylabel("MB/s of message bodies")
    throughput.set_title(f"Throughput ({report['date']}, {report['machine']['cpus']} CPUs, same machine)")
    throughput.legend(fontsize=8)
    producers = report["settings"]["producers"][0]
    groups = [(name, size) for size in sizes for name in names if (name, "fixed-rate", size, producers) in table]
    for offset, percentile_name in enumerate(("p50", "p99", "p999")):
        values = [table[(name, "fixed-rate", size, producers)][f"latency_ms_{percentile_name}"] for name, size in groups]
        latency.bar([index + offset * 0.27 for index in range(len(groups))], values, 0.27, label=percentile_name)
    latency.set_xticks([index + 0.27 for index in range(len(groups))])
    latency.set_xticklabels([f"{name}\n{size} B" for name, size in groups], fontsize=8)
    latency.set_yscale("log")
    latency.set_ylabel("ms (log scale)")
    latency.set_title(f"Produce latency per message at {report['settings']['rate_fraction']:.0%} of each system's "
                      f"rate with {producers} producer(s)")
    latency.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    plot.close(figure)


if __name__ == "__main__":
    main()
