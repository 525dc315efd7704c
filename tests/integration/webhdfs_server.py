"""WebHdfsServer: a WebHDFS REST server for tests of the HDFS object store, written to the Hadoop WebHDFS documentation:
a namenode endpoint that answers metadata operations and redirects (307) CREATE and OPEN to a datanode endpoint, both
on 127.0.0.1, in a subprocess (killable and restartable), the file system kept in a directory.

Operations: CREATE (overwrite, permission ignored), OPEN (offset, length), GETFILESTATUS, LISTSTATUS, MKDIRS, DELETE
(recursive), RENAME (destination, renameoptions=OVERWRITE), SETXATTR (flag CREATE/REPLACE; values "text", 0x hex,
0s base64), GETXATTRS (encoding text/hex/base64; xattr.name). Errors are RemoteException JSON with the documented
statuses: IllegalArgumentException 400, SecurityException 401, AccessControlException and other IOException 403,
FileNotFoundException 404. user.name is simple authentication; users given as denied get AccessControlException on
every operation. The datanode logs each request it serves ("datanode CREATE ..." / "datanode OPEN ...") to the log."""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PREFIX = "/webhdfs/v1"
BLOCK_SIZE = 134_217_728
DEFAULT_USER = "dr.who"


class WebHdfsServer:
    """The WebHDFS server program (this file run as a script) in a subprocess: a namenode at url and a datanode on
    another free port, files under base_dir/fs, xattrs under base_dir/xattrs (they survive a restart)."""

    def __init__(self, base_dir: Path, log_path: Path, *, denied_users: tuple[str, ...] = ()):
        from rocket.transport.listen import free_ports
        self.base_dir = base_dir
        self.log_path = log_path
        self.denied_users = denied_users
        self.namenode_port, self.datanode_port = free_ports(2)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.namenode_port}"

    def start(self, timeout_s: float = 20.0) -> "WebHdfsServer":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        arguments = [sys.executable, __file__, str(self.base_dir), str(self.namenode_port), str(self.datanode_port),
                     ",".join(self.denied_users)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the WebHDFS server did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def inject_standby(self, count: int) -> None:
        """The namenode's next count answers are StandbyException (a namenode failing over), as HDFS sends them."""
        with NO_PROXY_OPENER.open(f"{self.url}/_test/standby?count={count}", timeout=10.0) as response:
            assert response.status == 200, response.status

    def datanode_requests(self, op: str) -> list[str]:
        """The log lines of the datanode's served requests of op (CREATE or OPEN)."""
        prefix = f"datanode {op} "
        return [line for line in self.log_path.read_text().splitlines() if line.startswith(prefix)]

    def _answers(self) -> bool:
        for port in (self.namenode_port, self.datanode_port):
            try:
                with NO_PROXY_OPENER.open(f"http://127.0.0.1:{port}/webhdfs/v1/?op=GETFILESTATUS", timeout=1.0):
                    pass
            except urllib.error.HTTPError:
                pass
            except OSError:
                return False
        return True


# The server program: run as `python webhdfs_server.py BASE_DIR NAMENODE_PORT DATANODE_PORT DENIED_USERS`.


class RemoteError(Exception):
    """A Java exception as WebHDFS sends it: {"RemoteException": {"exception", "javaClassName", "message"}}."""

    STATUSES = {"IllegalArgumentException": 400, "UnsupportedOperationException": 400, "SecurityException": 401,
                "FileNotFoundException": 404}
    PACKAGES = {"IllegalArgumentException": "java.lang", "UnsupportedOperationException": "java.lang",
                "SecurityException": "java.lang", "FileNotFoundException": "java.io", "IOException": "java.io",
                "EOFException": "java.io", "AccessControlException": "org.apache.hadoop.security",
                "StandbyException": "org.apache.hadoop.ipc", "FileAlreadyExistsException": "org.apache.hadoop.fs",
                "ParentNotDirectoryException": "org.apache.hadoop.fs",
                "PathIsNotEmptyDirectoryException": "org.apache.hadoop.fs"}

    def __init__(self, exception: str, message: str):
        super().__init__(message)
        self.exception = exception
        self.message = message
        self.status = self.STATUSES.get(exception, 403)  # every other IOException is 403 Forbidden

    def body(self) -> bytes:
        java_class = f"{self.PACKAGES.get(self.exception, 'java.io')}.{self.exception}"
        return json.dumps({"RemoteException": {"exception": self.exception, "javaClassName": java_class,
                                               "message": self.message}}).encode()


class FileSystem:
    """Files under base/fs; xattrs of a file in base/xattrs/<inode>.json, removed with the file."""

    def __init__(self, base: Path):
        self.files = base / "fs"
        self.xattrs = base / "xattrs"
        self.spool = base / "spool"
        for directory in (self.files, self.xattrs, self.spool):
            directory.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    def local(self, path: str) -> Path:
        if not path.startswith("/") or any(part in (".", "..") for part in path.split("/")):
            raise RemoteError("IllegalArgumentException", f"Invalid path name {path}")
        return self.files / path.strip("/") if path.strip("/") else self.files

    def status(self, path: str, local: Path, suffix: str) -> dict:
        info = local.stat()
        directory = local.is_dir()
        return {"accessTime": 0 if directory else int(info.st_atime * 1000),
                "blockSize": 0 if directory else BLOCK_SIZE, "childrenNum": len(os.listdir(local)) if directory else 0,
                "fileId": info.st_ino, "group": "supergroup",
                "length": 0 if directory else info.st_size, "modificationTime": int(info.st_mtime * 1000),
                "owner": "rocket", "pathSuffix": suffix, "permission": "755" if directory else "644",
                "replication": 0 if directory else 1, "storagePolicy": 0, "type": "DIRECTORY" if directory else "FILE"}

    def existing(self, path: str) -> Path:
        local = self.local(path)
        if not local.exists():
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        return local

    def read_xattrs(self, local: Path) -> dict[str, str]:
        try:
            return json.loads((self.xattrs / f"{local.stat().st_ino}.json").read_text())
        except FileNotFoundError:
            return {}

    def write_xattrs(self, local: Path, xattrs: dict[str, str]) -> None:
        (self.xattrs / f"{local.stat().st_ino}.json").write_text(json.dumps(xattrs))

    def forget(self, local: Path) -> None:
        """Drop the xattrs of a file or tree about to go (inode numbers are reused)."""
        for each in [local, *local.rglob("*")] if local.is_dir() else [local]:
            (self.xattrs / f"{each.stat().st_ino}.json").unlink(missing_ok=True)

    def parent_directory(self, path: str, local: Path, create: bool) -> None:
        ancestor = local.parent
        while ancestor != self.files and not ancestor.exists():
            ancestor = ancestor.parent
        if ancestor.exists() and not ancestor.is_dir():
            raise RemoteError("ParentNotDirectoryException", f"Parent path is not a directory: {path}")
        if create:
            local.parent.mkdir(parents=True, exist_ok=True)
        elif not local.parent.is_dir():
            raise RemoteError("FileNotFoundException", f"Parent directory doesn't exist: {path}")


def decode_xattr_value(value: str) -> bytes:
    try:
        if value.startswith(("0x", "0X")):
            return binascii.unhexlify(value[2:])
        if value.startswith(("0s", "0S")):
            return base64.b64decode(value[2:], validate=True)
    except (binascii.Error, ValueError):
        raise RemoteError("IllegalArgumentException", f"Invalid value for xattr.value: {value}") from None
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    return value.encode()


def encode_xattr_value(value: bytes, encoding: str) -> str:
    if encoding == "hex":
        return "0x" + value.hex()
    if encoding == "base64":
        return "0s" + base64.b64encode(value).decode()
    return '"' + value.decode("utf-8", "replace") + '"'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall
    role = "namenode"
    fs: FileSystem
    namenode_port = 0
    datanode_port = 0
    denied: frozenset[str] = frozenset()
    standby = [0]  # answers still to refuse with StandbyException (the namenode's, shared by its threads)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass

    def log(self, line: str) -> None:
        print(line, flush=True)

    def do_GET(self) -> None:
        self.handle_method("GET")

    def do_PUT(self) -> None:
        self.handle_method("PUT")

    def do_POST(self) -> None:
        self.handle_method("POST")

    def do_DELETE(self) -> None:
        self.handle_method("DELETE")

    def handle_method(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urlsplit(self.path)
        query = {name: values[-1] for name, values in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if url.path == "/_test/standby" and self.role == "namenode":
                self.standby[0] = int(query.get("count", "1"))
                return self.send(200, b"")
            if not url.path.startswith(PREFIX):
                return self.send(404, b"Not Found", "text/plain")
            path = unquote(url.path[len(PREFIX):]) or "/"
            op = query.get("op", "").upper()
            user = query.get("user.name", DEFAULT_USER)
            self.log(f"{self.role} request {method} {op} {path} user={user}")
            if self.role == "namenode" and self.standby[0] > 0:
                self.standby[0] -= 1
                raise RemoteError("StandbyException", "Operation category READ is not supported in state standby")
            if user in self.denied:
                raise RemoteError("AccessControlException", f"Permission denied: user={user}, access=EXECUTE, "
                                                            f"inode=\"{path}\":hdfs:supergroup:drwx------")
            handler = getattr(self, f"{self.role}_{method}_{op}", None)
            if handler is None:
                raise RemoteError("IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": "
                                                              f"{op or '(none)'} is not a valid {method} operation")
            with self.fs.lock:
                handler(path, query, body)
        except RemoteError as error:
            self.send(error.status, error.body())
        except Exception as error:  # noqa: BLE001 - a bug here: answered as HDFS answers a RuntimeException
            self.log(f"{self.role} failed: {type(error).__name__}: {error}")
            failure = RemoteError("RuntimeException", f"{type(error).__name__}: {error}")
            failure.status = 500
            self.send(500, failure.body())

    def send(self, status: int, body: bytes, content_type: str = "application/json",
             headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def json(self, answer: object) -> None:
        self.send(200, json.dumps(answer).encode())

    def redirect(self, path: str, query: dict[str, str]) -> None:
        query = {**query, "namenoderpcaddress": f"127.0.0.1:{self.namenode_port}"}
        encoded = "&".join(f"{quote(name)}={quote(value, safe='')}" for name, value in query.items())
        location = f"http://127.0.0.1:{self.datanode_port}{PREFIX}{quote(path)}?{encoded}"
        self.send(307, b"", "application/octet-stream", {"Location": location})

    # The namenode.

    def namenode_PUT_CREATE(self, path: str, query: dict[str, str], body: bytes) -> None:
        self.fs.local(path)
        self.redirect(path, query)  # "the request is redirected to a datanode where the file data is to be written"

    def namenode_GET_OPEN(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.existing(path)
        if local.is_dir():
            raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
        self.redirect(path, query)

    def namenode_GET_GETFILESTATUS(self, path: str, query: dict[str, str], body: bytes) -> None:
        self.json({"FileStatus": self.fs.status(path, self.fs.existing(path), "")})

    def namenode_GET_LISTSTATUS(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.existing(path)
        if not local.is_dir():
            statuses = [self.fs.status(path, local, "")]  # a file lists as itself
        else:
            statuses = [self.fs.status(path, local / name, name) for name in sorted(os.listdir(local))]
        self.json({"FileStatuses": {"FileStatus": statuses}})

    def namenode_PUT_MKDIRS(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.local(path)
        self.fs.parent_directory(path, local, create=True)
        if local.exists() and not local.is_dir():
            raise RemoteError("FileAlreadyExistsException", f"Path is not a directory: {path}")
        local.mkdir(exist_ok=True)
        self.json({"boolean": True})

    def namenode_DELETE_DELETE(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.local(path)
        if not local.exists():
            return self.json({"boolean": False})
        if local == self.fs.files:
            return self.json({"boolean": False})  # the root is never deleted
        if local.is_dir():
            if os.listdir(local) and query.get("recursive", "false") != "true":
                raise RemoteError("PathIsNotEmptyDirectoryException", f"`{path} is non empty': Directory is not "
                                                                       "empty")
            self.fs.forget(local)
            shutil.rmtree(local)
        else:
            self.fs.forget(local)
            local.unlink()
        self.json({"boolean": True})

    def namenode_PUT_RENAME(self, path: str, query: dict[str, str], body: bytes) -> None:
        destination = query.get("destination", "")
        if not destination.startswith("/"):
            raise RemoteError("IllegalArgumentException", f"Invalid value for webhdfs parameter \"destination\": "
                                                          f"{destination!r} is not an absolute path")
        options = {option.strip().upper() for option in query.get("renameoptions", "").split(",") if option.strip()}
        if not options <= {"NONE", "OVERWRITE"}:
            raise RemoteError("IllegalArgumentException", f"Invalid value for webhdfs parameter \"renameoptions\": "
                                                          f"{query['renameoptions']}")
        source, target = self.fs.local(path), self.fs.local(destination)
        if not options:  # FileSystem.rename: false rather than an exception
            if target.is_dir():
                target = target / source.name
            if not source.exists() or target.exists() or not target.parent.is_dir() or source == self.fs.files:
                return self.json({"boolean": False})
            os.rename(source, target)
            return self.json({"boolean": True})
        # FileContext.rename (ClientProtocol.rename2): exceptions, and OVERWRITE replaces the destination atomically.
        if not source.exists():
            raise RemoteError("FileNotFoundException", f"rename source {path} is not found.")
        if not target.parent.is_dir():
            raise RemoteError("FileNotFoundException", f"rename destination parent {destination} not found.")
        if target.exists():
            if "OVERWRITE" not in options:
                raise RemoteError("FileAlreadyExistsException", f"rename destination {destination} already exists.")
            if target.is_dir() != source.is_dir():
                raise RemoteError("IOException", f"Source {path} and destination {destination} must both be "
                                                 "directories")
            if target.is_dir() and os.listdir(target):
                raise RemoteError("IOException", f"rename destination directory is not empty: {destination}")
            self.fs.forget(target)
        os.replace(source, target)
        self.send(200, b"", "application/octet-stream")

    def namenode_PUT_SETXATTR(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.existing(path)
        name = checked_xattr_name(query.get("xattr.name", ""))
        value = decode_xattr_value(query.get("xattr.value", ""))
        flags = {flag.strip().upper() for flag in query.get("flag", "").split(",") if flag.strip()}
        if not flags or not flags <= {"CREATE", "REPLACE"}:
            raise RemoteError("IllegalArgumentException", f"Invalid value for webhdfs parameter \"flag\": "
                                                          f"{query.get('flag')}")
        xattrs = self.fs.read_xattrs(local)
        if name in xattrs and "REPLACE" not in flags:
            raise RemoteError("IOException", f"XAttr: {name} already exists. The REPLACE flag must be specified.")
        if name not in xattrs and "CREATE" not in flags:
            raise RemoteError("IOException", f"XAttr: {name} does not exist. The CREATE flag must be specified.")
        xattrs[name] = value.hex()
        self.fs.write_xattrs(local, xattrs)
        self.send(200, b"", "application/octet-stream")

    def namenode_GET_GETXATTRS(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.existing(path)
        encoding = query.get("encoding", "text").lower()
        if encoding not in ("text", "hex", "base64"):
            raise RemoteError("IllegalArgumentException", f"Invalid value for webhdfs parameter \"encoding\": "
                                                          f"{encoding}")
        xattrs = self.fs.read_xattrs(local)
        names = [values for name, values in parse_qs(urlsplit(self.path).query).items() if name == "xattr.name"]
        wanted = [checked_xattr_name(name) for name in names[0]] if names else sorted(xattrs)
        if any(name not in xattrs for name in wanted):
            raise RemoteError("IOException", "At least one of the attributes provided was not found.")
        self.json({"XAttrs": [{"name": name, "value": encode_xattr_value(bytes.fromhex(xattrs[name]), encoding)}
                              for name in wanted]})

    # The datanode.

    def datanode_PUT_CREATE(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.local(path)
        if local == self.fs.files or local.is_dir():
            raise RemoteError("FileAlreadyExistsException", f"{path} already exists as a directory")
        if local.exists() and query.get("overwrite", "false") != "true":
            raise RemoteError("FileAlreadyExistsException", f"{path} for client 127.0.0.1 already exists")
        self.fs.parent_directory(path, local, create=True)
        spooled = self.fs.spool / uuid.uuid4().hex
        spooled.write_bytes(body)
        if local.exists():
            self.fs.forget(local)  # overwrite makes a new file: the old one's xattrs go with it
        os.replace(spooled, local)
        self.log(f"datanode CREATE {path} {len(body)} bytes")
        self.send(201, b"", "application/octet-stream",
                  {"Location": f"hdfs://127.0.0.1:{self.namenode_port}{quote(path)}"})

    def datanode_GET_OPEN(self, path: str, query: dict[str, str], body: bytes) -> None:
        local = self.fs.existing(path)
        if local.is_dir():
            raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
        try:
            offset = int(query.get("offset", "0"))
            length = int(query["length"]) if query.get("length") else None
        except ValueError:
            raise RemoteError("IllegalArgumentException", "Invalid value for webhdfs parameter \"offset\" or "
                                                          "\"length\"") from None
        if offset < 0 or (length is not None and length < 0):
            raise RemoteError("IllegalArgumentException", "offset and length must be >= 0")
        data = local.read_bytes()
        if offset > len(data):
            raise RemoteError("EOFException", "Cannot seek after EOF")
        served = data[offset:] if length is None else data[offset:offset + length]
        self.log(f"datanode OPEN {path} {len(served)} bytes")
        self.send(200, served, "application/octet-stream")


def checked_xattr_name(name: str) -> str:
    namespace, dot, rest = name.partition(".")
    if not dot or not rest or namespace.lower() not in ("user", "trusted", "system", "security", "raw"):
        raise RemoteError("IllegalArgumentException", f"An XAttr name must be prefixed with user/trusted/security/"
                                                      f"system/raw, followed by a '.': {name}")
    if namespace.lower() != "user":
        raise RemoteError("AccessControlException", f"User doesn't have permission for xattr: {name}")
    return f"user.{rest}"


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog of 5 drops concurrent connects, which retry only after 1 s
    daemon_threads = True


def serve(base: Path, namenode_port: int, datanode_port: int, denied: frozenset[str]) -> None:
    fs = FileSystem(base)
    servers = []
    for role, port in (("namenode", namenode_port), ("datanode", datanode_port)):
        handler = type(f"{role.title()}Handler", (Handler,), {"role": role, "fs": fs, "namenode_port": namenode_port,
                                                              "datanode_port": datanode_port, "denied": denied,
                                                              "standby": [0]})
        server = Server(("127.0.0.1", port), handler)
        servers.append(server)
    threading.Thread(target=servers[1].serve_forever, daemon=True).start()
    print(f"WebHDFS namenode on {namenode_port}, datanode on {datanode_port}, files in {base}", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
          frozenset(user for user in sys.argv[4].split(",") if user) if len(sys.argv) > 4 else frozenset())
