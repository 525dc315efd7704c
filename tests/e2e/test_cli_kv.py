"""The kv commands as a user drives them against a real `rocket run`: values and revisions on standard output,
refusals as one line naming their code with exit 1, usage errors with exit 2, export and import through a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.e2e.test_cli import rocket


def watch_for(seconds: float, *args: str, server) -> bytes:
    """What `rocket kv watch` printed in its first seconds (it runs until stopped)."""
    environment = {**os.environ, "ROCKET_SERVER": server.server}
    try:
        subprocess.run([sys.executable, "-m", "rocket", "kv", "watch", *args], capture_output=True, env=environment,
                       timeout=seconds)
    except subprocess.TimeoutExpired as expired:
        return expired.stdout or b""
    raise AssertionError("rocket kv watch ended by itself")


def test_kv_session(server_process, tmp_path):
    server = server_process().start()
    assert b"created bucket config with 2 shards" in rocket("kv", "bucket", "create", "config", "--shards", "2",
                                                            "--history", "2", server=server).stdout
    first = int(rocket("kv", "put", "config", "feature/x", "on", server=server).stdout)
    assert rocket("kv", "get", "config", "feature/x", server=server).stdout == b"on\n"
    entry = json.loads(rocket("kv", "get", "config", "feature/x", "--format", "json", server=server).stdout)
    assert entry["revision"] == first and entry["version"] == 1

    missing = rocket("kv", "get", "config", "nope", server=server, check=False)
    assert missing.returncode == 1 and missing.stderr.decode().count("\n") == 1 and b"NOT_FOUND" in missing.stderr
    refused = rocket("kv", "cas", "config", "feature/x", "off", "on", server=server, check=False)
    assert refused.returncode == 1 and b"CAS_FAILED" in refused.stderr and b"revision" in refused.stderr
    stale = rocket("kv", "put", "config", "feature/x", "z", "--if-revision", str(first + 100), server=server,
                   check=False)
    assert stale.returncode == 1 and f"revision {first}".encode() in stale.stderr
    assert int(rocket("kv", "cas", "config", "feature/x", "on", "off", server=server).stdout) > first
    assert rocket("kv", "get", "config", "feature/x", "--revision", str(first), server=server).stdout == b"on\n"
    assert rocket("kv", "put", "config", "k", "v", "--if-revision", "1", "--if-absent", server=server,
                  check=False).returncode == 2
    assert rocket("kv", "put", "config", "k", "v", "--ttl", "soon", server=server, check=False).returncode == 2

    rocket("kv", "put", "config", "app/a", "1", server=server)
    rocket("kv", "put", "config", "app/b", "2", server=server)
    assert rocket("kv", "ls", "config", "app/", server=server).stdout == b"app/a\t1\napp/b\t2\n"
    assert rocket("kv", "ls", "config", "--count", server=server).stdout == b"3\n"
    txn = tmp_path / "txn.json"
    txn.write_text(json.dumps({"compare": [{"key": "app/a", "target": "value", "op": "==", "value": "1"}],
                               "success": [{"op": "put", "key": "app/a", "value": "10"}]}))
    assert json.loads(rocket("kv", "txn", "config", "--file", str(txn), server=server).stdout)["succeeded"]
    assert rocket("kv", "txn", "config", "--file", str(txn), server=server, check=False).returncode == 1

    export = tmp_path / "config.rkv"
    assert b"exported 3 keys" in rocket("kv", "export", "config", "--out", str(export), server=server).stdout
    assert b"imported 3 keys" in rocket("kv", "import", "copy", "--in", str(export), server=server).stdout
    assert rocket("kv", "ls", "copy", "--keys-only", server=server).stdout == b"app/a\napp/b\nfeature/x\n"
    watched = watch_for(5, "copy", "--from-revision", "0:1,1:1", "--format", "json", server=server)
    assert {json.loads(line)["key"] for line in watched.splitlines()} == {"app/a", "app/b", "feature/x"}
    assert rocket("kv", "del", "config", "app/", "--prefix", server=server).stdout == b"2\n"
    rocket("kv", "bucket", "delete", "copy", server=server)
    listed = json.loads(rocket("kv", "bucket", "list", "--format", "json", server=server).stdout)
    assert listed["name"] == "config"
