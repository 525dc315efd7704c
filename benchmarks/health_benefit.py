"""What acting on an unhealthy node is worth (issue 31): the cluster's produce p99 with one storage node's disk made
N times slower, with the nameserver acting on its judgement (the node degraded, its leaderships moved off) and, in a
second cluster under the same load, with detection off (ROCKET_HEALTH_ACT=false: judged, not acted on).

Each run starts examples/cluster afresh under BASE/<mode> (every storage node's data dir on slowfs, so that all pay
the FUSE passthrough alike), creates a topic over every storage group, and sends messages at a fixed rate from
SENDERS tasks. A send's latency counts from when it was due, so a stall delays the sends behind it too (no
coordinated omission). After a warm-up and a healthy phase, the storage node leading the most groups gets a slow
disk (faults.py slow_disk) until the end. Reported per mode: the p99 of the healthy phase, of the fault before the
node was degraded and its leaders moved, and of the fault after (from the time the acting run's victim led nothing,
plus a settling margin; the same offset from the fault's start in the run that does not act).

    python benchmarks/health_benefit.py [--quick] [--factor 10] [--rate 300] [--out benchmarks/results/health_benefit]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import faults  # noqa: E402
from rocket.client.admin import Admin  # noqa: E402
from rocket.client.connection import connect  # noqa: E402
from rocket.client.producer import open_producer  # noqa: E402
from rocket.errors import RocketError  # noqa: E402
from rocket.model import Message  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster" / "cluster.sh"
STORAGE = ("storage1", "storage2", "storage3")
SENDERS = 16
SETTLE_S = 10.0  # after the victim leads nothing, before its p99 counts as "after": the sends queued behind the slow disk drain
POLL_S = 1.0


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def cluster(command: str, base: Path, env: dict) -> None:
    subprocess.run(["bash", str(CLUSTER), command, str(base)], check=True, env=env, stdout=subprocess.DEVNULL)


async def send_at_rate(server: str, topic: str, rate: float, stop: trio.Event, latencies: list) -> None:
    """SENDERS tasks, each sending one message every SENDERS / rate seconds; (due time, latency) per send."""
    body = b"x" * 512

    async def sender(producer, offset_s: float) -> None:
        interval_s = SENDERS / rate
        due = trio.current_time() + offset_s
        while not stop.is_set():
            await trio.sleep_until(due)
            try:
                await producer.send(Message(body))
                latencies.append((due, trio.current_time() - due))
            except RocketError as error:
                latencies.append((due, float("inf")))
                print(f"send failed: {error}", flush=True)
            due += interval_s

    async with connect(server) as channel, open_producer(channel, topic, linger_s=0.0) as producer:
        async with trio.open_nursery() as nursery:
            for number in range(SENDERS):
                nursery.start_soon(sender, producer, number / rate)


async def scenario(server: str, base: Path, rate: float, factor: float, warm_s: float, healthy_s: float,
                   fault_s: float) -> dict:
    async with connect(server) as channel:
        admin = Admin(channel)
        await admin.create_topic("benefit", 12)
        latencies: list[tuple[float, float]] = []
        events: dict[str, float] = {}
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_at_rate, server, "benefit", rate, stop, latencies)
            started = trio.current_time()
            await trio.sleep(warm_s + healthy_s)
            status = await admin.cluster_status()
            storage = [node for node in status["nodes"] if node["id"] in (11, 12, 13)]
            victim = max(storage, key=lambda node: (len(node["load"]["leads"]), -node["id"]))
            name = {11: "storage1", 12: "storage2", 13: "storage3"}[victim["id"]]
            apply, remove, _ = faults.fault_actions(base, name, "slow_disk", factor)
            apply()
            events["fault"] = trio.current_time() - started
            print(f"slow disk x{factor:g} on {name} (it led {len(victim['load']['leads'])} groups)", flush=True)
            try:
                while trio.current_time() - started < warm_s + healthy_s + fault_s:
                    await trio.sleep(POLL_S)
                    health = await admin.node_health(victim["id"])
                    at = trio.current_time() - started
                    if "degraded" not in events and health["nodes"][0]["state"] == "degraded":
                        events["degraded"] = at
                    status = await admin.cluster_status()
                    leads = next(len(node["load"]["leads"]) for node in status["nodes"] if node["id"] == victim["id"])
                    if "degraded" in events and "led_nothing" not in events and leads == 0:
                        events["led_nothing"] = at
            finally:
                remove()
                stop.set()
        return {"victim": victim["id"], "events": events, "started": started,
                "latencies": [(due - started, latency) for due, latency in latencies]}


def summarise(run: dict, warm_s: float, after_from_s: float, end_s: float) -> dict:
    fault_s = run["events"]["fault"]
    phases = {"healthy": (warm_s, fault_s), "fault_before": (fault_s, after_from_s), "fault_after": (after_from_s, end_s)}
    out = {}
    for phase, (begin, end) in phases.items():
        values = [latency for at, latency in run["latencies"] if begin <= at < end]
        p99 = percentile(values, 0.99)
        out[phase] = {"sends": len(values), "p50_ms": round(percentile(values, 0.5) * 1000, 2) if values else None,
                      "p99_ms": round(p99 * 1000, 2) if p99 is not None else None}
    healthy, after = out["healthy"]["p99_ms"], out["fault_after"]["p99_ms"]
    out["after_over_healthy_p99"] = round(after / healthy, 2) if healthy and after is not None else None
    # p99 per 5 s of the run: the timeline the figures come from
    buckets: dict[int, list[float]] = {}
    for at, latency in run["latencies"]:
        buckets.setdefault(int(at // 5) * 5, []).append(latency)
    out["p99_ms_per_5s"] = {at: round(percentile(values, 0.99) * 1000, 1) for at, values in sorted(buckets.items())}
    return out


def run_mode(mode: str, args, port_base: int) -> dict:
    base = Path(args.base) / mode
    subprocess.run(["rm", "-rf", str(base)], check=True)
    base.mkdir(parents=True)
    env = {**os.environ, "PORT_BASE": str(port_base), "ROCKET_HEALTH_WINDOW_S": str(args.window_s),
           "ROCKET_HEALTH_ACT": "true" if mode == "act" else "false", "ROCKET_TELEMETRY_INTERVAL_S": "0"}
    for node in STORAGE:
        faults.prepare(base, node, slow_disk=True, proxy=False, port_base=port_base)
    try:
        cluster("start", base, env)
        server = f"127.0.0.1:{port_base + 21}"
        result = trio.run(scenario, server, base, args.rate, args.factor, args.warm_s, args.healthy_s, args.fault_s)
    finally:
        try:
            cluster("stop", base, env)
        finally:
            faults.teardown(base)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (about 5 minutes in all)")
    parser.add_argument("--factor", type=float, default=10.0, help="the slow disk's factor (default %(default)s)")
    parser.add_argument("--rate", type=float, default=300.0, help="messages per second (default %(default)s)")
    parser.add_argument("--window-s", type=float, default=5.0, help="health window (default %(default)s)")
    parser.add_argument("--base", default="/tmp/rocket-health-benefit")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "health_benefit"))
    args = parser.parse_args(argv)
    args.warm_s, args.healthy_s, args.fault_s = (15.0, 30.0, 75.0) if args.quick else (20.0, 60.0, 150.0)
    began = time.monotonic()
    port_base = 9700 + random.randrange(20) * 100
    runs = {mode: run_mode(mode, args, port_base) for mode in ("act", "off")}
    acted = runs["act"]["events"]
    if "led_nothing" not in acted:
        print("the acting run's victim never led nothing: no 'after' phase to compare", flush=True)
        after_offset = args.fault_s / 2
    else:
        after_offset = acted["led_nothing"] + SETTLE_S - acted["fault"]
    end_s = args.warm_s + args.healthy_s + args.fault_s
    result = {"settings": {"factor": args.factor, "rate": args.rate, "senders": SENDERS, "window_s": args.window_s,
                           "warm_s": args.warm_s, "healthy_s": args.healthy_s, "fault_s": args.fault_s,
                           "settle_s": SETTLE_S, "quick": args.quick},
              "after_from_fault_s": round(after_offset, 1), "wall_s": round(time.monotonic() - began, 1)}
    for mode, run in runs.items():
        result[mode] = {"victim": run["victim"], "events": {name: round(at, 1) for name, at in run["events"].items()},
                        **summarise(run, args.warm_s, run["events"]["fault"] + after_offset, end_s)}
    out = Path(args.out + ("_quick" if args.quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    for mode in ("act", "off"):
        figures = result[mode]
        print(f"{mode}: p99 healthy {figures['healthy']['p99_ms']} ms, fault before {figures['fault_before']['p99_ms']}"
              f" ms, fault after {figures['fault_after']['p99_ms']} ms ({figures['after_over_healthy_p99']}x healthy)")
    print(f"health benefit: after/healthy p99 act={result['act']['after_over_healthy_p99']} "
          f"off={result['off']['after_over_healthy_p99']} ({out / 'result.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
