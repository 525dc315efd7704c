"""The CLI as a user drives it against a real `rocket run`: topics, send, send --file, consume, describe."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def rocket(*args: str, server=None, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    if server is not None:
        environment["ROCKET_SERVER"] = server.server
    result = subprocess.run([sys.executable, "-m", "rocket", *args], input=stdin, capture_output=True,
                            env=environment, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_user_session(server_process, tmp_path):
    """Create a topic, send one message and a file of lines, consume them all once, and see them described."""
    server = server_process().start()
    rocket("topic", "create", "orders", "--queues", "8", server=server)
    sent = rocket("send", "orders", "hello", "--key", "user-1", "--tag", "paid", "--prop", "region=eu", server=server)
    assert b"offset 0" in sent.stdout
    lines = b"".join(b"line-%d\n" % number for number in range(1, 20_001))
    bulk = rocket("send", "orders", "--file", "-", server=server, stdin=lines)
    assert b"sent 20,000 messages" in bulk.stdout

    consumed = rocket("consume", "orders", "--group", "billing", "--count", "20001", "--format", "json", server=server)
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(records) == 20_001
    hello = [r for r in records if r["body"] == "hello"]
    assert hello and hello[0]["key"] == "user-1" and hello[0]["tag"] == "paid" and hello[0]["properties"] == {"region": "eu"}
    assert sorted(r["body"] for r in records if r["body"] != "hello") == sorted(f"line-{n}" for n in range(1, 20_001))

    again = rocket("consume", "orders", "--group", "billing", server=server)
    assert again.stdout == b"", "the group's committed position must hold"

    described = rocket("topic", "describe", "orders", server=server).stdout.decode()
    rows = [row.strip("│ ").split("│") for row in described.splitlines() if row.startswith("│")]
    messages_per_queue = [int(row[3].replace(",", "")) for row in rows if row[0].strip().isdigit()]
    assert len(messages_per_queue) == 8 and sum(messages_per_queue) == 20_001
    listed = rocket("topic", "list", server=server)
    assert b"orders" in listed.stdout and b"20,001" in listed.stdout


def test_send_file_over_http2_with_avro(server_process, tmp_path):
    """The bulk path works over the other transport and serde, from a file on disk."""
    server = server_process().start()
    path = tmp_path / "lines.txt"
    path.write_bytes(b"".join(b"%d\n" % n for n in range(50_000)))
    http2 = ("--server", f"127.0.0.1:{server.http2_port}", "--transport", "http2", "--serde", "avro")
    rocket("topic", "create", "events", "--queues", "4", *http2)
    rocket("send", "events", "--file", str(path), *http2)
    consumed = rocket("consume", "events", "--group", "g", "--format", "raw", *http2)
    assert sorted(int(line) for line in consumed.stdout.split()) == list(range(50_000))


def test_errors_are_one_clear_line(server_process, tmp_path):
    """Unknown topics, bad flags and an absent server give a code and a message, not a traceback."""
    server = server_process().start()
    missing = rocket("send", "nope", "x", server=server, check=False)
    assert missing.returncode == 1 and b"UNKNOWN_TOPIC" in missing.stderr and b"Traceback" not in missing.stderr
    bad_config = rocket("run", "--listen", "nowhere", check=False)
    assert bad_config.returncode == 2 and b"listen" in bad_config.stderr
    down = rocket("topic", "list", "--server", "127.0.0.1:1", check=False)
    assert down.returncode == 1 and b"UNAVAILABLE" in down.stderr


def test_follow_and_start_positions(server_process):
    """--follow prints messages as they arrive; --from latest skips the past; --from a time starts there."""
    import datetime
    import time

    server = server_process().start()
    rocket("topic", "create", "live", "--queues", "2", server=server)
    rocket("send", "live", "old", server=server)
    time.sleep(1.1)
    moment = datetime.datetime.now(datetime.timezone.utc).isoformat()
    rocket("send", "live", "new", server=server)

    later = rocket("consume", "live", "--group", "since", "--from", moment, "--format", "raw", server=server)
    assert later.stdout == b"new\n"
    latest = rocket("consume", "live", "--group", "tail", "--from", "latest", "--format", "raw", server=server)
    assert latest.stdout == b""

    environment = dict(os.environ, ROCKET_SERVER=server.server)
    follower = subprocess.Popen([sys.executable, "-m", "rocket", "consume", "live", "--group", "follower",
                                 "--from", "latest", "--follow", "--format", "raw"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment)
    try:
        time.sleep(1.5)  # let it take its starting position before anything new arrives
        rocket("send", "live", "fresh-1", server=server)
        rocket("send", "live", "fresh-2", server=server)
        lines = [follower.stdout.readline(), follower.stdout.readline()]
        assert sorted(lines) == [b"fresh-1\n", b"fresh-2\n"]
    finally:
        follower.terminate()
        follower.wait(10)


def test_message_and_group_commands(server_process):
    """Get a message by its id, find messages by key, schedule and cancel a delayed one, filter on
    consume, and see a group's lag: as a user types them."""
    server = server_process().start()
    rocket("topic", "create", "orders", "--queues", "4", server=server)
    for number in range(3):
        rocket("send", "orders", f"v{number}", "--key", "user-7", "--tag", ("paid", "open")[number % 2], server=server)
    sent = rocket("send", "orders", "other", "--key", "user-8", server=server)
    message_id = sent.stdout.decode().split("(id ")[1].split(")")[0]
    assert rocket("message", "get", "orders", message_id, "--format", "raw", server=server).stdout == b"other\n"
    found = rocket("message", "find", "orders", "--key", "user-7", "--format", "raw", server=server)
    assert found.stdout == b"v0\nv1\nv2\n"
    paid = rocket("consume", "orders", "--group", "g", "--tag", "paid", "--format", "raw", server=server)
    assert sorted(paid.stdout.split()) == [b"v0", b"v2"]
    bad = rocket("consume", "orders", "--group", "g", "--sql", "region = ", server=server, check=False)
    assert bad.returncode == 1 and b"BAD_FILTER" in bad.stderr and b"position" in bad.stderr
    described = rocket("group", "describe", "orders", "--group", "g", server=server).stdout.decode()
    [total] = [line.split("│") for line in described.splitlines() if "│ all" in line]
    assert [cell.strip() for cell in total[5:8]] == ["0", "0", "0"]  # in flight, lag, dead letters
    rocket("group", "reset", "orders", "--group", "g", "--to", "earliest", server=server)
    described = rocket("group", "describe", "orders", "--group", "g", server=server).stdout.decode()
    [total] = [line.split("│") for line in described.splitlines() if "│ all" in line]
    assert total[6].strip() == "4"  # everything is to be read again

    rocket("topic", "create", "later", "--type", "delay", server=server)
    scheduled = rocket("send", "later", "soon", "--delay", "1h", server=server).stdout.decode()
    timer_id = scheduled.split("as timer ")[1].split()[0]
    assert b"cancelled" in rocket("message", "cancel", "later", timer_id, server=server).stdout
    again = rocket("message", "cancel", "later", timer_id, server=server, check=False)
    assert again.returncode == 1 and b"NOT_FOUND" in again.stderr
    refused = rocket("send", "later", "now", server=server, check=False)
    assert refused.returncode == 1 and b"WRONG_MESSAGE_TYPE" in refused.stderr


def test_bench_produce_then_consume_report_beside_the_raw_disk(server_process, tmp_path):
    """`rocket bench produce` fills a topic that `rocket bench consume` then reads back whole, with messages and
    with bodies only; each JSON report puts its result beside the raw disk probes (before and after the run, and
    with O_DIRECT where the file system allows it)."""
    server = server_process().start()
    produced = tmp_path / "produce.json"
    rocket("bench", "produce", "--messages", "3000", "--topic", "bench", "--disk-dir", str(tmp_path / "disk"),
           "--json", str(produced), server=server)
    report = json.loads(produced.read_text())
    assert report["result"]["messages"] == 3000 and report["result"]["mb_per_s"] > 0
    assert len(report["raw_disk"]) == 2 and all(disk["mb_per_s"] > 0 for disk in report["raw_disk"])
    assert report["ratio_to_raw_disk"] == report["result"]["mb_per_s"] / report["raw_disk_mb_per_s"]
    if "raw_disk_direct" in report:  # absent on a file system without O_DIRECT (tmpfs)
        assert report["ratio_to_raw_disk_direct"] == report["result"]["mb_per_s"] / report["raw_disk_direct"]["mb_per_s"]
    assert not list((tmp_path / "disk").iterdir()), "the probes leave no file behind"
    for bodies in ([], ["--bodies"]):
        consumed = tmp_path / "consume.json"
        rocket("bench", "consume", "--topic", "bench", "--messages", "3000", *bodies, "--disk-dir", str(tmp_path / "disk"),
               "--json", str(consumed), server=server)
        assert json.loads(consumed.read_text())["result"]["messages"] == 3000
    # --rate paces the sends (a latency at a given load): 67 batches at 40 a second take at least 1.65 s; --no-probe
    # leaves the disk alone; a topic of 2 queues gets its warm-up messages in those 2
    rocket("topic", "create", "paced", "--queues", "2", server=server)
    paced = tmp_path / "paced.json"
    rocket("bench", "produce", "--messages", "1000", "--batch-bytes", "16384", "--rate", "40", "--in-flight", "64",
           "--topic", "paced", "--no-probe", "--json", str(paced), server=server)
    report = json.loads(paced.read_text())
    assert report["raw_disk"] == [] and "raw_disk_direct" not in report
    result = report["result"]
    assert result["batches"] == 67 and result["rate_batches_per_s"] == 40 and result["seconds"] >= 66 / 40
    assert result["send_late_ms_p99"] >= 0 and result["latency_ms_p99"] > 0


def test_storage_class_commands(server_process):
    """One storage node: storage-class list shows the default raft class; a controller-mode class of two replicas is
    refused UNAVAILABLE in one line, and bad settings BAD_REQUEST; a raft-mode class is made, described, listed, and
    a topic placed in it."""
    server = server_process().start()
    listed = rocket("cluster", "storage-class", "list", server=server).stdout.decode()
    assert "raft" in listed and "majority" in listed
    short = rocket("cluster", "storage-class", "create", "gold", "--mode", "controller", "--replicas", "2",
                   server=server, check=False)
    assert short.returncode == 1 and short.stderr.decode().count("\n") == 1
    assert b"UNAVAILABLE: storage class 'gold' needs 2 storage nodes up for its 2 replicas; 1 is up" in short.stderr
    for bad, says in [(("--mode", "paxos"), b"mode must be one of raft, controller"),
                      (("--replicas", "1"), b"needs 2..7 replicas"),
                      (("--min-in-sync-replicas", "3"), b"min_in_sync_replicas must be 1..2"),
                      (("--ha-max-lag-s", "0.1"), b"ha_max_lag_s must be 0.5..3600 seconds")]:
        refused = rocket("cluster", "storage-class", "create", "gold", *bad, server=server, check=False)
        assert refused.returncode == 1 and b"error: BAD_REQUEST: " in refused.stderr and says in refused.stderr, bad

    made = rocket("cluster", "storage-class", "create", "fast", "--mode", "raft", "--replicas", "1", "--groups", "2",
                  server=server).stdout.decode()
    assert "created raft-mode storage class fast: 2 groups of 1 replica" in made
    topic = rocket("topic", "create", "quick", "--queues", "4", "--storage-class", "fast", server=server)
    assert b"with 4 queues in storage class fast" in topic.stdout
    missing = rocket("topic", "create", "slow", "--storage-class", "gold", server=server, check=False)
    assert missing.returncode == 1 and b"storage class 'gold' does not exist" in missing.stderr
    described = json.loads(rocket("cluster", "storage-class", "describe", "fast", "--json", server=server).stdout)
    assert described["name"] == "fast" and described["mode"] == "raft" and len(described["groups"]) == 2
    text = rocket("cluster", "storage-class", "describe", "fast", server=server).stdout.decode()
    assert "storage class fast: raft mode, 1 replica" in text
    assert all(str(group["id"]) in text for group in described["groups"])
    classes = json.loads(rocket("cluster", "storage-class", "list", "--json", server=server).stdout)["classes"]
    assert [entry["name"] for entry in classes] == ["raft", "fast"]
