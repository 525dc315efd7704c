"""One typed config tree for a node: TOML file < ROCKET_* environment < command-line flags.

Every problem is reported as one ConfigError line naming the key; the CLI exits with status 2.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import tomllib
from pathlib import Path
from typing import Any, Literal, cast, overload

from rocket import limits
from rocket.errors import RocketError
from rocket.model import Address, check_namespace, check_topic_name, parse_duration_s

ROLES = ("nameserver", "storage", "broker", "controller")
ALL_ROLES = ROLES[:3]  # "all": a node of the cluster in one process; the standalone controller runs on its own nodes
TIER_BACKENDS = ("local", "s3", "azure", "gcs", "hdfs", "off")
TLS_MODES = ("enforcing", "permissive")  # RocketMQ's TlsMode, without its "disabled": no tls_cert is that
TIER_READ_MODES = ("not_in_disk", "force")  # RocketMQ's tieredStorageLevel: tier only what is not local, or always


class ConfigError(Exception):
    """An invalid setting: the message names the key and what is wrong with it."""


DEFAULT_LISTEN = Address("127.0.0.1", 9876)


def ranged(default: Any, low: Any, high: Any) -> Any:
    """A number setting: its default, and the range a config may set it to (load refuses one outside it, naming the
    range; the manual's reference shows it). An int default makes it an integer setting."""
    return dataclasses.field(default=default, metadata={"range": (low, high)})


@dataclasses.dataclass(frozen=True, slots=True)
class NodeConfig:
    roles: tuple[str, ...] = ALL_ROLES
    data_dir: Path = Path("rocket-data")
    listen: Address = DEFAULT_LISTEN
    http2_listen: Address | None = Address("127.0.0.1", 9877)
    # HTTP/1.1 (/metrics, /healthz, /readyz); when no source sets it, _dev_http_listen chooses.
    http_listen: Address | None = None
    mqtt_listen: Address | None = None  # MQTT 3.1.1 and 5.0 for devices, on brokers; off unless set
    mqtt_namespace: str = ""  # the rocket namespace MQTT's topics, consumer groups and KV buckets lie in
    mqtt_topic: str = ""  # the rocket topic all MQTT topics lie in, each whole as its tag; "": their first levels name
    # Shared by a cluster's nodes (config file or ROCKET_CLUSTER_SECRET): with it, the methods between nodes answer
    # only connections that proved they know it (PeerHello); without it they answer anyone who reaches the port.
    cluster_secret: str = dataclasses.field(default="", repr=False)
    # Every call from a client by a signed-in user whom the policies allow (rocket/access.py); needs cluster_secret,
    # which user secrets are sealed under. The first user, `admin`, gets auth_admin_secret, or one printed once.
    auth: bool = False
    auth_admin_secret: str = dataclasses.field(default="", repr=False)
    http2_tls_cert: Path | None = None  # with http2_tls_key: the HTTP/2 listener speaks TLS (ALPN h2) instead of h2c
    http2_tls_key: Path | None = None
    # This node's certificate chain and key: the TCP listener speaks TLS, and HTTP/2 too unless http2_tls_* are set.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # The cluster's CA bundle: with it, nodes talk mutual TLS (each presents tls_cert, and verifies the other's
    # against tls_ca), and a connection whose client certificate verified is a node of the cluster.
    tls_ca: Path | None = None
    # enforcing: only TLS on the TCP port; permissive: plain and TLS both (told apart by the first byte), to move a
    # cluster to TLS one node at a time.
    tls_mode: str = "enforcing"
    # ignored: the segments of an earlier build's store log; more than 4 GiB is a typo, not a wish
    segment_bytes: int = ranged(limits.segment_bytes_default, limits.segment_bytes_min, 4 * limits.GiB)
    wal_segment_bytes: int = ranged(limits.raft_wal_segment_bytes_default, limits.raft_wal_segment_bytes_min,
                                    4 * limits.GiB)
    # The WAL's newest bytes kept in the page cache; older pages are dropped once written or read, and reads of
    # them go to the disk in a worker thread. 0: the OS decides. On a VM that hands free memory back to its host
    # (virtio-balloon free page reporting), a write into a fresh page costs a host fault, and a bound (such as
    # 64 MiB) lets writes reuse warm pages (benchmarks/RESULTS.md, "Fresh pages: why the raw-disk probe swings").
    wal_cached_bytes: int = ranged(0, 0, 2**50)
    # The WAL written with O_DIRECT, past the page cache, from memory of its own that also serves reads of its
    # newest wal_cached_bytes (0: limits.wal_direct_cached_bytes_default); reads of older bytes go to the disk.
    # Faster only where buffered writes take fresh pages (benchmarks/RESULTS.md, "Direct I/O"). Off where the
    # file system has no O_DIRECT (tmpfs), or the OS.
    wal_direct_io: bool = False
    shutdown_grace_s: float = ranged(limits.shutdown_grace_s, 0.0, 3600.0)  # more than an hour is a typo
    # The TCP port's connections (rocket's frames and remoting's): closed when a request frame takes longer than
    # tcp_frame_s to arrive, or when one has no call in flight (a long poll and a stream are calls) for tcp_idle_s.
    # At least 0.1 s: a loaded node may pause that long between two reads of one frame; past an hour, or a week of
    # idleness, is no limit.
    tcp_frame_s: float = ranged(limits.tcp_frame_s_default, 0.1, 3600.0)
    tcp_idle_s: float = ranged(limits.tcp_idle_s_default, 0.1, 7 * 86_400.0)
    # HTTP/2 connections: one with no open stream this long is closed (GOAWAY); a request body, or a gRPC message,
    # not complete this long after it began is reset. Open gRPC streams (telemetry, long polls) are not idle.
    http2_idle_s: float = ranged(limits.http2_idle_s_default, 0.1, 86_400.0)
    http2_request_s: float = ranged(limits.http2_request_s_default, 0.1, 86_400.0)
    log_level: str = "info"
    # The cluster: this node's id, the nameserver group (id -> address; empty: this node alone),
    # the address the other nodes reach this one at (default: listen), and the storage layout.
    node_id: int = ranged(1, 1, 2**31 - 1)
    nameservers: tuple[tuple[int, Address], ...] = ()
    # The standalone controller group (RIP-44, `--role controller`; id -> address): set on the nameservers and storage
    # nodes, it decides controller-mode groups' masters; empty: the nameservers' embedded controller does (unless this
    # node runs the controller role itself: then it is the group, alone).
    controllers: tuple[tuple[int, Address], ...] = ()
    advertise: Address | None = None
    replication: int = ranged(3, 1, limits.replication_max)
    storage_groups: int = ranged(8, 1, limits.storage_groups_max)
    # Shorter than 10 ms spends the node on timers; longer than 10 s makes elections take minutes.
    raft_tick_s: float = ranged(limits.raft_tick_s, 0.01, 10.0)
    # Transactions: the first check-back of an open transaction, the interval between checks, and how
    # many checks before it counts as unresolved (RocketMQ's transactionTimeOut, check interval, max checks).
    # Outside a tenth of a second to a day is a typo, not a policy.
    transaction_timeout_s: float = ranged(6.0, 0.1, 86_400.0)
    transaction_check_s: float = ranged(60.0, 0.1, 86_400.0)
    transaction_checks_max: int = ranged(15, 1, limits.checks_config_max)
    # RocketMQ 5 clients (the gRPC API): deliveries before a message goes to the dead-letter queue.
    rocketmq_max_attempts: int = ranged(limits.pop_attempts_default, 1, limits.checks_config_max)
    # Tiered storage: where pieces go (a local directory, default data_dir/tier; S3, Azure Blob or GCS), default
    # retentions (0 = for ever) a topic's own settings override, where reads of offloaded data go, and the piece size.
    tier_backend: str = "local"
    tier_directory: Path | None = None
    tier_s3_endpoint: str = ""
    tier_s3_bucket: str = ""
    tier_s3_region: str = "us-east-1"
    tier_s3_prefix: str = ""
    tier_s3_path_style: bool = True
    tier_azure_container: str = ""  # credentials: AZURE_STORAGE_CONNECTION_STRING, else the URL (with a SAS) ...
    tier_azure_account_url: str = ""  # ... and AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY
    tier_azure_prefix: str = ""
    tier_gcs_bucket: str = ""
    tier_gcs_endpoint: str = ""  # empty: Google's; given (an emulator), no credentials unless a service file
    tier_gcs_service_file: str = ""  # a service account's JSON key; empty: GOOGLE_APPLICATION_CREDENTIALS, metadata
    tier_gcs_prefix: str = ""
    tier_hdfs_url: str = ""  # the namenode's WebHDFS address, http://HOST:9870
    tier_hdfs_root: str = "/rocket"  # the HDFS directory the pieces go under
    tier_hdfs_user: str = ""  # sent as user.name (simple authentication); empty: the namenode's default
    tier_retention_s: float = 0.0
    tier_local_retention_s: float = limits.tier_local_retention_s_default
    tier_read_mode: str = "not_in_disk"
    # 1 KiB (tests; smaller would make one object per batch) to 1 GiB (a piece is built in memory before its PUT)
    tier_piece_bytes: int = ranged(limits.tier_piece_bytes_default, 1 * limits.KiB, 1 * limits.GiB)
    tier_piece_age_s: float = limits.tier_piece_age_s_default
    # The disk (DATA_DIR/tier-cache, emptied at start) that keeps the ranges of tiered objects cold reads fetched from
    # a remote store, for the reads after them; least recently read out first. The local tier needs none.
    tier_cache_bytes: int = ranged(limits.cold_cache_bytes_default, limits.cold_cache_bytes_min,
                                   limits.cold_cache_bytes_max)
    # Telemetry: how often the node samples its metrics into Avro files under data_dir/telemetry, shipped to the
    # object store's telemetry/ (the tier's store: a local directory in dev mode, S3 in a cluster). 0: off.
    telemetry_interval_s: float = limits.telemetry_interval_s_default
    # /metrics: per-queue series too (rocket_queue_*), one per queue this node leads; off, a topic's are summed.
    metrics_per_queue: bool = False
    # Leader transfers and replica-count moves the nameserver leader may make to even out load, per hour (a token
    # bucket: an hour's worth at once); moves off degraded, down or draining nodes never wait. 0: none.
    rebalance_moves_per_hour: float = ranged(limits.rebalance_moves_per_hour_default, 0.0,
                                             3600.0 / limits.leader_transfer_s)
    # Unhealthy nodes: the nameserver leader judges each storage node's fsync p99 and failing calls once per window.
    # At most 10 minutes: a node slower than that to judge is judged too late to help.
    health_window_s: float = ranged(limits.health_window_s_default, limits.health_window_s_min, 600.0)
    # false: judge and report, but act only on operators' pins (to measure what acting is worth)
    health_act: bool = True
    # a node degraded this long has its replicas moved away, within the replica move budget (a slow disk that lasts);
    # 0: at once; a wait of over a week is no policy: pin the node or drain it
    health_move_after_s: float = ranged(600.0, 0.0, 7 * 86_400.0)

    @property
    def address(self) -> Address:
        """Where the other nodes reach this one."""
        return self.advertise or self.listen

    def nameserver_members(self) -> dict[int, Address]:
        """The nameserver group: as configured, or this node alone (dev mode)."""
        if self.nameservers:
            return dict(self.nameservers)
        return {self.node_id: self.address}

    def controller_members(self) -> dict[int, Address]:
        """The standalone controller group: as configured, or this node alone when it runs the controller role."""
        if self.controllers or "controller" not in self.roles:
            return dict(self.controllers)
        return {self.node_id: self.address}

    def tier_key(self, key: str) -> str:
        """The key in the object store of an object of the cluster's own (telemetry, models): under tier_s3_prefix
        when one is set, as S3's pieces are."""
        return f"{self.tier_s3_prefix}/{key}" if self.tier_s3_prefix else key


_keys = {field.name for field in dataclasses.fields(NodeConfig)}
_RANGED = {field.name: (type(field.default) is int, *field.metadata["range"])
           for field in dataclasses.fields(NodeConfig) if "range" in field.metadata}


@overload
def parse_address(key: str, value: object, allow_off: Literal[False] = False) -> Address: ...


@overload
def parse_address(key: str, value: object, allow_off: bool) -> Address | None: ...


def parse_address(key: str, value: object, allow_off: bool = False) -> Address | None:
    text = str(value).strip()
    if allow_off and text.lower() in ("", "off", "none"):
        return None
    try:
        return Address.parse(text)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def parse_roles(key: str, value: object) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    roles: list[str] = []
    for item in (str(item).strip() for item in items):
        if item == "all":
            roles.extend(ALL_ROLES)
        elif item in ROLES:
            roles.append(item)
        else:
            raise ConfigError(f"{key}: unknown role {item!r}; expected all, {', '.join(ROLES)} or a comma-separated list")
    if not roles:
        raise ConfigError(f"{key}: at least one role is needed")
    return tuple(role for role in ROLES if role in roles)


def parse_members(key: str, value: object) -> tuple[tuple[int, Address], ...]:
    """ID@HOST:PORT entries, as a list or comma-separated."""
    items = value if isinstance(value, (list, tuple)) else [item for item in str(value).split(",") if item.strip()]
    members: dict[int, Address] = {}
    for item in (str(item).strip() for item in items):
        node, separator, address = item.partition("@")
        if not separator or not node.isdigit() or int(node) < 1:
            raise ConfigError(f"{key}: expected ID@HOST:PORT with an id of 1 or more, got {item!r}")
        if int(node) in members:
            raise ConfigError(f"{key}: node id {node} is listed twice")
        members[int(node)] = parse_address(key, address)
    return tuple(members.items())


def _parse_int(key: str, value: object, low: int, high: int) -> int:
    try:
        number = int(str(value).strip()) if not isinstance(value, int) or isinstance(value, bool) else value
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if isinstance(value, bool) or not low <= number <= high:
        raise ConfigError(f"{key}: must be between {low} and {high}, got {value!r}")
    return number


def _parse_float(key: str, value: object, low: float, high: float) -> float:
    try:
        # float() is handed whatever the source held; a value it cannot take raises TypeError, caught below.
        number = float(cast(Any, value))
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if not low <= number <= high:
        raise ConfigError(f"{key}: must be between {low} and {high}, got {value!r}")
    return number


def _parse_duration(key: str, value: object) -> float:
    """Seconds, as a number or a duration such as 90s, 1h or 365d."""
    if isinstance(value, str) and value.strip() and not value.strip().replace(".", "", 1).isdigit():
        try:
            value = parse_duration_s(value)
        except RocketError as error:
            raise ConfigError(f"{key}: {error.message}") from None
    return _parse_float(key, value, 0.0, limits.retention_s_max)


def _parse_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
    return text


def _parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    return text in ("true", "1", "yes")


def _convert(key: str, value: object) -> object:
    if key in _RANGED:
        integer, low, high = _RANGED[key]
        return _parse_int(key, value, low, high) if integer else _parse_float(key, value, low, high)
    if key == "tier_backend":
        return _parse_choice(key, value, TIER_BACKENDS)
    if key == "tier_read_mode":
        return _parse_choice(key, value, TIER_READ_MODES)
    if key == "tls_mode":
        return _parse_choice(key, value, TLS_MODES)
    if key in ("http2_tls_cert", "http2_tls_key", "tls_cert", "tls_key", "tls_ca"):
        path = Path(str(value))
        if not path.is_file():
            raise ConfigError(f"{key}: {path} is not a file")
        return path
    if key == "tier_directory":
        return Path(str(value)) if str(value).strip() else None
    if key in ("tier_s3_bucket", "tier_s3_region", "tier_azure_container", "tier_gcs_bucket",
               "tier_gcs_service_file"):
        return str(value).strip()
    if key in ("tier_s3_prefix", "tier_azure_prefix", "tier_gcs_prefix"):
        return str(value).strip().strip("/")
    if key == "mqtt_namespace":
        try:
            return check_namespace(str(value).strip())
        except RocketError as error:
            raise ConfigError(f"{key}: {error.message}") from None
    if key == "mqtt_topic":
        try:
            return check_topic_name(str(value).strip()) if str(value).strip() else ""
        except RocketError as error:
            raise ConfigError(f"{key}: {error.message}") from None
    if key == "tier_hdfs_root":
        text = "/" + str(value).strip().strip("/")
        return text
    if key == "tier_hdfs_user":
        return str(value).strip()
    if key in ("tier_s3_endpoint", "tier_azure_account_url", "tier_gcs_endpoint", "tier_hdfs_url"):
        text = str(value).strip()
        if text and not text.startswith(("http://", "https://")):
            raise ConfigError(f"{key}: expected an http:// or https:// URL, got {value!r}")
        return text
    if key in ("tier_s3_path_style", "wal_direct_io", "health_act", "auth", "metrics_per_queue"):
        return _parse_bool(key, value)
    if key == "telemetry_interval_s":
        interval_s = _parse_duration(key, value)
        if interval_s and interval_s < limits.telemetry_interval_s_min:
            raise ConfigError(f"{key}: 0 (off) or at least {limits.telemetry_interval_s_min} s, got {value!r}")
        return interval_s
    if key in ("tier_retention_s", "tier_local_retention_s", "tier_piece_age_s"):
        return _parse_duration(key, value)
    if key == "roles":
        return parse_roles(key, value)
    if key == "data_dir":
        if not str(value).strip():
            raise ConfigError("data_dir: must not be empty")
        return Path(str(value))
    if key == "listen":
        return parse_address(key, value)
    if key in ("http2_listen", "http_listen", "mqtt_listen"):
        return parse_address(key, value, allow_off=True)
    if key in ("cluster_secret", "auth_admin_secret"):
        if len(str(value)) < limits.cluster_secret_chars_min:
            raise ConfigError(f"{key}: at least {limits.cluster_secret_chars_min} characters (a random one: "
                              "python3 -c 'import secrets; print(secrets.token_hex(32))')")
        return str(value)
    if key in ("nameservers", "controllers"):
        return parse_members(key, value)
    if key == "advertise":
        return parse_address(key, value, allow_off=True)
    if key == "log_level":
        level = str(value).lower()
        if level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level: expected debug, info, warning or error, got {value!r}")
        return level
    raise ConfigError(f"{key}: unknown setting; known settings are {', '.join(sorted(_keys))}")


def load(config_file: Path | None, environment: dict[str, str], flags: dict[str, object]) -> NodeConfig:
    """Merge the three sources, later ones winning, and validate every value."""
    # Any: _convert gives each key the type of its NodeConfig field.
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            document = tomllib.loads(config_file.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config: file {config_file} does not exist") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"config: {config_file} is not UTF-8 text (byte {error.start}): TOML files are "
                              "UTF-8") from None
        except OSError as error:
            raise ConfigError(f"config: cannot read {config_file}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config: {config_file} is not valid TOML: {error}") from None
        for key, value in document.items():
            values[key] = _convert(key, value)
    for key in _keys:
        name = f"ROCKET_{key.upper()}"
        if name in environment:
            try:
                values[key] = _convert(key, environment[name])
            except ConfigError as error:
                raise ConfigError(f"{name} (environment) -> {error}") from None
    for key, value in flags.items():
        if value is not None:
            values[key] = _convert(key, value)
    if "http_listen" not in values:
        values["http_listen"] = _dev_http_listen(values)
    config = NodeConfig(**values)
    if not config.nameservers and "nameserver" not in config.roles and config.roles != ("controller",):
        raise ConfigError("nameservers: a node without the nameserver role needs the nameserver group, as "
                          "ID@HOST:PORT,...")
    if config.nameservers and "nameserver" in config.roles and config.node_id not in dict(config.nameservers):
        raise ConfigError(f"nameservers: this node runs the nameserver role, so its node_id {config.node_id} "
                          "must be one of them")
    if config.controllers and "controller" in config.roles and config.node_id not in dict(config.controllers):
        raise ConfigError(f"controllers: this node runs the controller role, so its node_id {config.node_id} must be "
                          "one of them")
    if config.tier_backend == "s3" and not config.tier_s3_bucket:
        raise ConfigError("tier_s3_bucket: the s3 tier backend needs a bucket")
    if config.tier_backend == "azure" and not config.tier_azure_container:
        raise ConfigError("tier_azure_container: the azure tier backend needs a container")
    if config.tier_backend == "azure" and not (config.tier_azure_account_url
                                                or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")):
        raise ConfigError("tier_azure_account_url: the azure tier backend needs the account's URL, or "
                          "AZURE_STORAGE_CONNECTION_STRING in the environment")
    if config.tier_backend == "gcs" and not config.tier_gcs_bucket:
        raise ConfigError("tier_gcs_bucket: the gcs tier backend needs a bucket")
    if config.tier_backend == "hdfs" and not config.tier_hdfs_url:
        raise ConfigError("tier_hdfs_url: the hdfs tier backend needs the namenode's WebHDFS URL (http://HOST:9870)")
    if config.auth and not config.cluster_secret:
        raise ConfigError("auth: needs cluster_secret, the key user secrets are sealed under (the same on every node)")
    _check_tls(config)
    return config


def _check_tls(config: NodeConfig) -> None:
    """Certificates come with their keys and load; a CA bundle needs this node's certificate, and loads."""
    for prefix in ("http2_tls", "tls"):
        cert, key = getattr(config, f"{prefix}_cert"), getattr(config, f"{prefix}_key")
        if (cert is None) != (key is None):
            raise ConfigError(f"{prefix}_cert: TLS needs both {prefix}_cert and {prefix}_key")
        if cert is not None:
            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
            except (ssl.SSLError, OSError) as error:
                raise ConfigError(f"{prefix}_cert: cannot load {cert} with the key {key}: {error}") from None
    if config.tls_ca is not None:
        if config.tls_cert is None:
            raise ConfigError("tls_ca: mutual TLS needs this node's own certificate too (tls_cert and tls_key)")
        try:
            ssl.create_default_context(cafile=str(config.tls_ca))
        except (ssl.SSLError, OSError) as error:
            raise ConfigError(f"tls_ca: cannot load {config.tls_ca} as a CA bundle: {error}") from None


def _dev_http_listen(values: dict[str, object]) -> Address | None:
    """http_listen when none is set: in dev mode (no nameservers named) port 9878 beside the default TCP port 9876,
    a free port beside a free one (tests); otherwise off, as several nodes on one machine would share a port."""
    if values.get("nameservers"):
        return None
    listen = cast(Address, values.get("listen", DEFAULT_LISTEN))  # _convert parses "listen" to an Address
    if listen.port == DEFAULT_LISTEN.port:
        return Address(listen.host, 9878)
    return Address(listen.host, 0) if listen.port == 0 else None


def load_from_environment(config_file: Path | None, flags: dict[str, object]) -> NodeConfig:
    return load(config_file, dict(os.environ), flags)
