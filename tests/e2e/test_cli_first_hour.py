"""The rough edges a new user met in the first hour (issue 28), driven through the CLI against a real `rocket run`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from rocket import __version__ as rocket_version
from tests.e2e.test_cli import rocket


def messages_per_queue(server, topic: str) -> list[int]:
    described = rocket("topic", "describe", topic, server=server).stdout.decode()
    rows = [row.strip("│ ").split("│") for row in described.splitlines() if row.startswith("│")]
    return [int(row[3].replace(",", "")) for row in rows if row[0].strip().isdigit()]


def one_line_error(result: subprocess.CompletedProcess, status: int, *named: bytes) -> None:
    assert result.returncode == status, result.stderr.decode()
    assert b"Traceback" not in result.stderr and b"ExceptionGroup" not in result.stderr, result.stderr.decode()
    assert result.stderr.startswith(b"error: ") and result.stderr.count(b"\n") == 1, result.stderr.decode()
    for text in named:
        assert text in result.stderr, result.stderr.decode()


def test_bad_input_is_one_line_that_blames_its_own_option_with_exit_2(server_process, tmp_path):
    """Unreadable files, a missing body, bad or past delivery times and bad --to values are usage errors (exit 2)
    on one line that names the option at fault, and nothing is sent."""
    server = server_process().start()
    rocket("topic", "create", "orders", server=server)
    rocket("topic", "create", "later", "--type", "delay", server=server)
    one_line_error(rocket("send", "orders", "--file", str(tmp_path / "absent"), server=server, check=False), 2,
                   b"--file", b"no such file")
    one_line_error(rocket("send", "orders", "--file", str(tmp_path), server=server, check=False), 2,
                   b"--file", b"is a directory")
    neither = rocket("send", "orders", server=server, check=False)
    one_line_error(neither, 2, b"--file")
    assert b"not both" not in neither.stderr
    one_line_error(rocket("send", "later", "x", "--deliver-at", "yesterday", server=server, check=False), 2,
                   b"--deliver-at")
    one_line_error(rocket("send", "later", "x", "--deliver-at", "2020-01-01T00:00", server=server, check=False), 2,
                   b"--deliver-at", b"in the past")
    one_line_error(rocket("send", "later", "x", "--delay", "-5s", server=server, check=False), 2, b"--delay")
    one_line_error(rocket("group", "reset", "orders", "--group", "g", "--to", "yesterday", server=server, check=False),
                   2, b"--to")
    one_line_error(rocket("message", "find", "orders", "--key", "k", "--to", "yesterday", server=server, check=False),
                   2, b"--to")
    assert sum(messages_per_queue(server, "orders")) == 0 and sum(messages_per_queue(server, "later")) == 0
    one_line_error(rocket("send", "nope", "x", server=server, check=False), 1, b"UNKNOWN_TOPIC")


def test_a_non_utf8_config_is_one_line(tmp_path):
    """`rocket run --config` on a file that is not UTF-8 names the file on one line and exits 2."""
    config = tmp_path / "rocket.toml"
    config.write_bytes(b"listen = \"\xff\xfe\"\n")
    one_line_error(rocket("run", "--config", str(config), check=False), 2, str(config).encode(), b"UTF-8")


def test_a_tier_backend_without_its_client_library_is_one_line(tmp_path):
    """`rocket run` with tier_backend = azure where azure-storage-blob is not installed (hidden here) names the extra
    to install on one line and exits 2, as any config error."""
    config = tmp_path / "rocket.toml"
    config.write_text('tier_backend = "azure"\ntier_azure_container = "c"\n'
                      'tier_azure_account_url = "http://127.0.0.1:1"\n')
    hidden = ("import sys; sys.modules['azure'] = None; sys.argv[0] = 'rocket'; from rocket.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", hidden, "run", "--config", str(config), "--data-dir",
                             str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--http2-listen", "off"],
                            capture_output=True, timeout=60,
                            env={**os.environ, "AZURE_STORAGE_ACCOUNT": "a", "AZURE_STORAGE_KEY": "a"})
    one_line_error(result, 2, b"config: ", b"pip install 'rocket[azure]'")


def test_bulk_send_spreads_over_the_queues_and_a_key_keeps_its_order(server_process):
    """Lines sent without a key reach every queue; lines sent with a key all land in its queue, in order, with
    the key."""
    server = server_process().start()
    rocket("topic", "create", "orders", "--queues", "8", server=server)
    lines = b"".join(b"%d\n" % number for number in range(1, 100_001))
    sent = rocket("send", "orders", "--file", "-", server=server, stdin=lines)
    assert b"sent 100,000 messages" in sent.stdout
    spread = messages_per_queue(server, "orders")
    assert sum(spread) == 100_000 and all(count > 0 for count in spread), spread

    rocket("topic", "create", "keyed", "--queues", "4", server=server)
    keyed = b"".join(b"%d\n" % number for number in range(1, 30_001))
    rocket("send", "keyed", "--file", "-", "--key", "user-1", server=server, stdin=keyed)
    assert sorted(messages_per_queue(server, "keyed"))[:3] == [0, 0, 0]
    consumed = rocket("consume", "keyed", "--group", "g", "--format", "json", server=server)
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [int(record["body"]) for record in records] == list(range(1, 30_001))
    assert {record["key"] for record in records} == {"user-1"}


def test_ctrl_c_stops_a_follow_as_sigterm_does(server_process):
    """Ctrl-C (SIGINT) of `consume --follow` prints the consumed count, exits 0 as SIGTERM does, and never a
    traceback; the printed messages are committed."""
    server = server_process().start()
    rocket("topic", "create", "live", "--queues", "2", server=server)
    rocket("send", "live", "--file", "-", server=server, stdin=b"a\nb\nc\n")
    environment = dict(os.environ, ROCKET_SERVER=server.server)
    for number, stop in enumerate([signal.SIGINT, signal.SIGTERM, signal.SIGINT, signal.SIGINT]):
        follower = subprocess.Popen([sys.executable, "-m", "rocket", "consume", "live", "--group", f"g{number}",
                                     "--follow", "--format", "raw"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=environment)
        assert sorted(follower.stdout.readline() for _ in range(3)) == [b"a\n", b"b\n", b"c\n"]
        time.sleep(0.2 * number)  # land the signal at different moments of the long poll
        follower.send_signal(stop)
        _, errors = follower.communicate(timeout=30)
        assert follower.returncode == 0 and b"consumed 3 messages" in errors, errors.decode()
        assert b"Traceback" not in errors and b"ExceptionGroup" not in errors
        assert rocket("consume", "live", "--group", f"g{number}", server=server).stdout == b""


def test_node_start_failures_say_what_and_leave_nothing(server_process, tmp_path):
    """A port in use names its address and leaves no data directory behind; a second node on a data directory
    in use says another node uses it; the ready line gives both listeners as HOST:PORT."""
    server = server_process().start()
    taken = rocket("run", "--data-dir", str(tmp_path / "second"), "--listen", server.server,
                   "--http2-listen", "127.0.0.1:0", check=False)
    one_line_error(taken, 1, server.server.encode(), b"--listen")
    assert not (tmp_path / "second").exists()
    locked = rocket("run", "--data-dir", str(server.data_dir), "--listen", "127.0.0.1:0", "--http2-listen", "off",
                    check=False)
    one_line_error(locked, 1, b"another rocket node", str(server.data_dir).encode())

    other = server_process(tmp_path / "third")
    command = [sys.executable, "-m", "rocket", "run", "--data-dir", str(other.data_dir), "--listen", "127.0.0.1:0",
               "--http2-listen", "127.0.0.1:0"]
    other.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = other.process.stdout.readline().decode()
    assert line.startswith("rocket ready tcp=127.0.0.1:") and " http2=127.0.0.1:" in line, line


def test_a_client_on_the_wrong_kind_of_port_is_told_what_it_is(server_process):
    """TCP against the HTTP/2 port, and HTTP/2 against the TCP port, each get a hint of the transport to use."""
    server = server_process().start()
    over_tcp = rocket("topic", "list", "--server", f"127.0.0.1:{server.http2_port}", check=False)
    one_line_error(over_tcp, 1, b"--transport http2")
    over_http2 = rocket("topic", "list", "--server", server.server, "--transport", "http2", check=False)
    one_line_error(over_http2, 1, b"--transport tcp")


def test_plurals_delays_and_lookups_by_timer_id(server_process):
    """One of a thing is singular; a delay send prints its timer id with queue and offset, and `message get`
    shows the delayed message by that id."""
    server = server_process().start()
    created = rocket("topic", "create", "single", "--queues", "1", server=server)
    assert b"with 1 queue\n" in created.stdout
    rocket("send", "single", "only", server=server)
    consumed = rocket("consume", "single", "--group", "g", server=server)
    assert b"consumed 1 message " in consumed.stderr
    assert b"; 1 topic;" in rocket("cluster", "status", server=server).stdout
    status = json.loads(rocket("cluster", "status", "--json", server=server).stdout)
    assert [node["version"] for node in status["nodes"]] == [rocket_version]  # what `rocket --version` prints
    assert rocket("--version", server=None).stdout.decode().strip() == f"rocket {rocket_version}"

    rocket("topic", "create", "later", "--type", "delay", server=server)
    scheduled = rocket("send", "later", "soon", "--delay", "1h", server=server).stdout.decode()
    timer_id = scheduled.split("as timer ")[1].split()[0]
    queue, offset = timer_id.split(".")
    assert f"queue {queue} offset {offset}" in " ".join(scheduled.split())
    assert rocket("message", "get", "later", timer_id, "--format", "raw", server=server).stdout == b"soon\n"
    assert b"cancelled" in rocket("message", "cancel", "later", timer_id, server=server).stdout


def test_bench_produce_cleans_up_after_itself(server_process, tmp_path):
    """`rocket bench produce` without --topic leaves its topic to expire and says so, and creates no ./rocket-data
    where it runs."""
    server = server_process().start()
    here = tmp_path / "elsewhere"
    here.mkdir()
    environment = dict(os.environ, ROCKET_SERVER=server.server)
    result = subprocess.run([sys.executable, "-m", "rocket", "bench", "produce", "--messages", "2000"],
                            capture_output=True, cwd=here, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert b"retention" in result.stderr and b"drop" in result.stderr
    assert not list(here.iterdir()), "no ./rocket-data, no probe file"
    listed = rocket("topic", "list", server=server).stdout.decode()
    assert "bench-" in listed


def test_help_describes_every_option_without_bool_and_gives_a_version():
    """Every command's help describes each option, shows no <bool> on flags, states the exit codes and the
    --server default; --version prints the version."""
    import typer.main

    from rocket.cli import app

    undescribed = []

    def walk(command, path):
        for parameter in command.params:
            if not getattr(parameter, "help", None):
                undescribed.append(f"{path} {parameter.name}")
        for name, subcommand in getattr(command, "commands", {}).items():
            walk(subcommand, f"{path} {name}")

    walk(typer.main.get_command(app), "rocket")
    assert undescribed == []
    environment = dict(os.environ, COLUMNS="200")
    for command in (["--help"], ["consume", "--help"], ["send", "--help"], ["bench", "produce", "--help"]):
        shown = subprocess.run([sys.executable, "-m", "rocket", *command], capture_output=True, env=environment,
                               timeout=60).stdout
        assert b"<bool>" not in shown
    top = subprocess.run([sys.executable, "-m", "rocket", "--help"], capture_output=True, env=environment).stdout
    assert b"Exit status" in top and b"usage error" in top
    send_help = subprocess.run([sys.executable, "-m", "rocket", "send", "--help"], capture_output=True,
                               env=environment).stdout
    assert b"127.0.0.1:9876" in send_help
    assert rocket("--version").stdout.startswith(b"rocket ")
