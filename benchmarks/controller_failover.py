"""Controller-mode (RIP-44) failover as a soak: tests/integration/controller_cluster.py's processes (three nameservers,
two storage nodes, a broker; a class of two replicas and three groups; topic "orders" on it), one writer per queue
producing through the broker all along, and --cycles times: kill -9 the storage node that masters the most groups,
measure until every writer is acknowledged again, restart the node and wait until both replicas are in every group's
sync state set; then --handovers times, each group's mastership handed over to its other replica (rocket cluster
handover), each measured by its writer's longest wait for an acknowledgement. At the end every acknowledged message
is consumed and checked (tests/integration/test_cluster.py's
verify_acknowledged: at its offset, intact, in order); duplicates from resends are counted.

A cycle's failover time runs from the kill to the acknowledgement of each writer's first batch sent after it, for its
slowest writer. It is split by the node logs and a probe: detection (kill -> the controller's "node X is master at
epoch N" line, in the nameserver leader's log; with --standalone, the controller leader's), promotion (-> the survivor
serves a read only a master serves, asked every 50 ms) and the broker (-> the writers' acknowledgements). Prints one
line per cycle and the totals; writes benchmarks/results/controller-failover.json. Node logs stay in the run's
directory with --keep-data (or on failure).

    PYTHONPATH=. python benchmarks/controller_failover.py [--cycles 50] [--handovers 0] [--queues 3] [--pause-s 1]
        [--standalone] [--data-parent /tmp] [--keep-data] [--out benchmarks/results/controller-failover.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' cluster harness, whatever the current directory

from rocket import limits  # noqa: E402
from rocket.client import Admin, connect  # noqa: E402
from rocket.client.bench import percentile  # noqa: E402
from tests.integration.controller_cluster import (  # noqa: E402
    BROKER, GROUPS, ControllerCluster, Failover, create_topic, hand_over_each, kill_busiest_master, log_times)
from tests.integration.test_cluster import BATCH, Writers, verify_acknowledged  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "controller-failover.json"
STANDALONE = (31, 32, 33)  # --standalone: the controller runs on these nodes (`rocket run --role controller`)
ELECTED = re.compile(r"group (\d+): node (\d+) is master at epoch (\d+)")
NOT_CONSUMED = re.compile(r"(\d+) acknowledged messages not consumed where acknowledged")
WARMUP_S = 3.0
STOP_WAIT_S = 60.0


def spread(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
            "max": round(max(values), 3), "count": len(values)} if values else {}


def elections_logged(cluster: ControllerCluster, record: Failover) -> dict[int, float]:
    """group -> seconds from the kill to the controller's line electing the survivor (any nameserver's log, or any
    standalone controller's)."""
    elected: dict[int, float] = {}
    for node in [*cluster.nameservers.values(), *cluster.controllers.values()]:
        for at, line in log_times(node.log_path, "is master at epoch"):
            found = ELECTED.search(line)
            if at >= record.killed_wall and found and int(found.group(2)) == record.survivor:
                group = int(found.group(1))
                elected[group] = min(elected.get(group, at - record.killed_wall), at - record.killed_wall)
    return elected


def cycle_row(number: int, record: Failover, elected: dict[int, float]) -> dict:
    detection = max(elected.values()) if elected else None
    promotion = max(record.promoted_s.values())
    return {"cycle": number, "victim": record.victim, "survivor": record.survivor, "mastered": record.mastered,
            "failover_s": round(record.failover_s, 3),
            "writers_s": {str(queue): round(seconds, 3) for queue, seconds in sorted(record.writers_s.items())},
            "detection_s": round(detection, 3) if detection is not None else None,
            "elected_logged_s": {str(group): round(seconds, 3) for group, seconds in sorted(elected.items())},
            "promotion_s": round(promotion, 3),
            "promoted_s": {str(group): round(seconds, 3) for group, seconds in sorted(record.promoted_s.items())},
            "broker_s": round(record.failover_s - promotion, 3),
            "elected_polled_s": round(record.elected_s, 3), "epochs_after": {
                str(group): list(pair) for group, pair in sorted(record.epochs_after.items())},
            "restart_ready_s": round(record.ready_s, 3), "in_sync_s": round(record.in_sync_s, 3)}


def print_cycle(row: dict) -> None:
    writers = row["writers_s"].values()
    print(f"cycle {row['cycle']:3d}: kill -9 node {row['victim']} (master of {row['mastered']} groups): failover "
          f"{row['failover_s']:.2f} s (writers {min(writers):.2f}-{max(writers):.2f}); elected at "
          f"{row['detection_s']} s (controller log), node {row['survivor']} serving as master at "
          f"{row['promotion_s']:.2f} s, broker +{row['broker_s']:.2f} s; restarted, ready in "
          f"{row['restart_ready_s']:.2f} s, in every sync state set {row['in_sync_s']:.2f} s later", flush=True)


async def soak(args: argparse.Namespace, base: Path) -> dict:
    cluster = ControllerCluster(base, controllers=STANDALONE if args.standalone else ())
    started = time.monotonic()
    rows: list[dict] = []
    stalls: list[float] = []
    aborted = None
    try:
        await cluster.start()
        async with connect(cluster.broker.server) as channel:
            admin = Admin(channel)
            await create_topic(admin, args.queues)
            queue_groups = await cluster.queue_groups()
            queues = list(range(args.queues))
            print(f"cluster up after {time.monotonic() - started:.1f} s; queues -> groups {queue_groups}; "
                  f"logs in {base}", flush=True)
            writers = Writers({BROKER: cluster.broker.server})
            async with trio.open_nursery() as writing:
                for queue in queues:
                    writing.start_soon(writers.write, queue, 0)
                await trio.sleep(WARMUP_S)
                try:
                    for number in range(1, args.cycles + 1):
                        record = await kill_busiest_master(cluster, writers, admin, queues, queue_groups)
                        rows.append(cycle_row(number, record, elections_logged(cluster, record)))
                        print_cycle(rows[-1])
                        await trio.sleep(args.pause_s)
                    for number in range(1, args.handovers + 1):
                        stalls.extend(round(stall, 3) for stall in await hand_over_each(writers, admin, queues,
                                                                                        queue_groups))
                        print(f"handovers {number}: writers' longest waits {stalls[-len(set(queue_groups)):]} s",
                              flush=True)
                        await trio.sleep(args.pause_s)
                except AssertionError as error:
                    aborted = str(error)
                    print(f"aborted: {aborted}", flush=True)
                writers.stop.set()
                with trio.fail_after(STOP_WAIT_S):
                    while writers.done < len(queues):
                        await trio.sleep(0.1)
        died = cluster.died()
        writing_s = time.monotonic() - started
        print(f"verifying {sum(len(ack.seqs) for ack in writers.acks)} acknowledged messages...", flush=True)
        try:
            checked = await verify_acknowledged(writers, cluster.broker.server, base)
            lost, failure = 0, None
        except (AssertionError, pytest.fail.Exception) as error:
            checked, failure = None, str(error)
            found = NOT_CONSUMED.search(failure)
            lost = int(found.group(1)) if found else None
    finally:
        cluster.kill()
    acknowledged = len({seq for ack in writers.acks for seq in ack.seqs})
    return {
        "rows": rows, "handover_stalls_s": stalls, "aborted": aborted, "died": died, "failure": failure,
        "writing_s": round(writing_s, 1),
        "acknowledged": acknowledged, "batches": len(writers.acks), "lost": lost,
        "consumed": checked["consumed"] if checked else None,
        "duplicated": checked["duplicates"] if checked else None,
        "duplicated_batches": [list(entry) for entry in checked["duplicated_batches"]] if checked else None,
        "never_acknowledged": checked["never_acknowledged"] if checked else None,
        "writer_errors": dict(writers.errors), "writer_resends": writers.resends,
        "wall_s": round(time.monotonic() - started, 1)}


def report(args: argparse.Namespace, outcome: dict) -> dict:
    rows = outcome.pop("rows")
    figures = {
        "failover_s": spread([row["failover_s"] for row in rows]),
        "failover_per_writer_s": spread([seconds for row in rows for seconds in row["writers_s"].values()]),
        "detection_s": spread([row["detection_s"] for row in rows if row["detection_s"] is not None]),
        "promotion_s": spread([row["promotion_s"] for row in rows]),
        "broker_s": spread([row["broker_s"] for row in rows]),
        "restart_ready_s": spread([row["restart_ready_s"] for row in rows]),
        "in_sync_s": spread([row["in_sync_s"] for row in rows]),
        "handover_stall_s": spread(outcome["handover_stalls_s"]),
    }
    return {
        "benchmark": "controller_failover", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "setup": {"cycles": args.cycles, "cycles_done": len(rows), "controller": "standalone" if args.standalone
                  else "embedded", "groups": GROUPS, "queues": args.queues,
                  "writers": args.queues, "batch_messages": BATCH, "pause_s": args.pause_s,
                  "controller_lapse_s": limits.controller_lapse_s, "controller_check_s": limits.controller_check_s,
                  "node_heartbeat_s": limits.node_heartbeat_s,
                  "storage_retry_backoff_s_max": limits.storage_retry_backoff_s_max},
        "measured": {
            "failover_s": "kill -> acknowledgement of each writer's first batch sent after the kill; a cycle's is "
                          "its slowest writer's (failover_per_writer_s: every writer of every cycle)",
            "detection_s": "kill -> the controller's 'node X is master at epoch N' log line, last group",
            "promotion_s": "kill -> the survivor serves a leader-only StorageRead, last group (polled every 50 ms)",
            "broker_s": "promotion -> the cycle's failover (the broker's retries finding the new master)",
            "in_sync_s": "restarted node ready -> both replicas in every group's sync state set (polled)",
            "handover_stall_s": "a handover's writer: its longest wait between acknowledgements, from the handover's "
                                "call to 1 s after a batch sent after it was acknowledged",
            "percentiles": "nearest rank over the cycles (with 50 cycles, p99 is the maximum)"},
        "figures": figures, **outcome, "cycles": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--handovers", type=int, default=0, help="rounds of handing every group over, after the kills")
    parser.add_argument("--queues", type=int, default=GROUPS, help="queues of the topic, one writer each")
    parser.add_argument("--standalone", action="store_true",
                        help="three standalone controllers (--role controller), not the nameservers' embedded one")
    parser.add_argument("--pause-s", type=float, default=1.0, help="between a node back in sync and the next kill")
    parser.add_argument("--data-parent", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.cycles < 0 or args.handovers < 0 or args.cycles + args.handovers < 1 or args.queues < 1:
        parser.error("--cycles and --handovers must not be negative, one of them positive, and --queues at least 1")
    base = Path(tempfile.mkdtemp(prefix="controller-failover-", dir=args.data_parent))
    outcome = trio.run(soak, args, base)
    result = report(args, outcome)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    figures = result["figures"]
    ok = not (result["aborted"] or result["died"] or result["failure"])
    print(f"failover over {len(result['cycles'])} cycles: p50 {figures['failover_s'].get('p50')} s, p99 "
          f"{figures['failover_s'].get('p99')} s, max {figures['failover_s'].get('max')} s (detection p50 "
          f"{figures['detection_s'].get('p50')} s, promotion p50 {figures['promotion_s'].get('p50')} s, broker p50 "
          f"{figures['broker_s'].get('p50')} s); back in sync p50 {figures['in_sync_s'].get('p50')} s, max "
          f"{figures['in_sync_s'].get('max')} s; handover stall p50 {figures['handover_stall_s'].get('p50')} s, p99 "
          f"{figures['handover_stall_s'].get('p99')} s; acknowledged {result['acknowledged']} messages, lost "
          f"{result['lost']}, duplicated {result['duplicated']}; writer errors {result['writer_errors']}; wall "
          f"{result['wall_s']} s; {args.out}", flush=True)
    if not ok:
        print(f"FAILED: aborted {result['aborted']}; died {result['died']}; {result['failure']}", flush=True)
    if ok and not args.keep_data:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
