"""Node config: file < environment < flags, and one clear line naming the key for every bad value."""

import dataclasses
from pathlib import Path

import pytest

from rocket import config, limits
from rocket.config import ConfigError
from rocket.model import Address


def test_precedence_file_then_environment_then_flags(tmp_path: Path):
    """Each later source overrides the earlier ones, key by key."""
    file = tmp_path / "rocket.toml"
    file.write_text('listen = "127.0.0.1:1000"\nhttp2_listen = "127.0.0.1:2000"\ndata_dir = "/from-file"\n')
    loaded = config.load(file, {"ROCKET_HTTP2_LISTEN": "127.0.0.1:3000", "ROCKET_DATA_DIR": "/from-env"},
                         {"data_dir": "/from-flag"})
    assert loaded.listen == Address("127.0.0.1", 1000)
    assert loaded.http2_listen == Address("127.0.0.1", 3000)
    assert loaded.data_dir == Path("/from-flag")


def test_defaults_are_dev_mode():
    """With nothing given, a node runs every role on the documented ports with ./rocket-data."""
    loaded = config.load(None, {}, {})
    assert loaded.roles == ("nameserver", "storage", "broker")
    assert (str(loaded.listen), str(loaded.http2_listen)) == ("127.0.0.1:9876", "127.0.0.1:9877")
    assert loaded.data_dir == Path("rocket-data")
    assert (loaded.wal_cached_bytes, loaded.wal_direct_io) == (0, False)
    assert config.load(None, {"ROCKET_WAL_DIRECT_IO": "true"}, {}).wal_direct_io


@pytest.mark.parametrize(
    "file_text, environment, flags, named",
    [
        ("listen = 5\n", {}, {}, "listen"),
        ("bogus = 1\n", {}, {}, "bogus"),
        ("listen = [\n", {}, {}, "not valid TOML"),
        ("", {"ROCKET_SEGMENT_BYTES": "ten"}, {}, "ROCKET_SEGMENT_BYTES"),
        ("wal_segment_bytes = 1048576\n", {}, {}, "wal_segment_bytes"),  # the biggest entry would not fit
        ("", {}, {"roles": "broker,teapot"}, "teapot"),
        ("", {}, {"http2_listen": "host:99999"}, "http2_listen"),
        ("", {}, {"roles": "storage,broker"}, "nameservers"),  # who would it register with?
        ("", {}, {"nameservers": "1@h:1,2@h:2", "node_id": "3"}, "nameservers"),  # a nameserver not in its group
        ("", {}, {"nameservers": "1@h:1,1@h:2"}, "twice"),
        ("", {"ROCKET_NAMESERVERS": "one@h:1"}, {}, "ROCKET_NAMESERVERS"),
        ("", {}, {"replication": "0"}, "replication"),
        ("", {"ROCKET_WAL_CACHED_BYTES": "-1"}, {}, "ROCKET_WAL_CACHED_BYTES"),
        ("", {"ROCKET_WAL_DIRECT_IO": "maybe"}, {}, "ROCKET_WAL_DIRECT_IO"),
        ("wal_direct_io = 2\n", {}, {}, "wal_direct_io"),
    ],
)
def test_bad_values_name_their_key(tmp_path: Path, file_text, environment, flags, named):
    """A bad setting from any source raises ConfigError whose one-line message names the culprit."""
    file = tmp_path / "rocket.toml"
    file.write_text(file_text)
    with pytest.raises(ConfigError) as caught:
        config.load(file, environment, flags)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_roles_accept_lists_and_all():
    """Comma-separated roles and 'all' expand to the canonical order."""
    assert config.parse_roles("roles", "broker,nameserver") == ("nameserver", "broker")
    assert config.parse_roles("roles", "all") == config.ALL_ROLES == ("nameserver", "storage", "broker")
    assert config.parse_roles("roles", "controller,all") == config.ROLES


def test_a_standalone_controller_is_configured_by_its_members():
    """`--role controller` alone needs no nameservers; with controllers named, it is one of them; a nameserver or a
    storage node given controllers uses them (controller_members), and without, the embedded controller (empty)."""
    alone = config.load(None, {}, {"roles": "controller"})
    assert alone.controller_members() == {1: alone.address} and alone.nameservers == ()
    members = "31@127.0.0.1:7001,32@127.0.0.1:7002"
    storage = config.load(None, {"ROCKET_CONTROLLERS": members},
                          {"roles": "storage", "nameservers": "1@127.0.0.1:7000"})
    assert [str(address) for address in storage.controller_members().values()] == ["127.0.0.1:7001", "127.0.0.1:7002"]
    assert config.load(None, {}, {}).controller_members() == {}  # dev mode: the embedded controller
    with pytest.raises(config.ConfigError, match="controllers: this node runs the controller role"):
        config.load(None, {}, {"roles": "controller", "node_id": 5, "controllers": members})
    with pytest.raises(config.ConfigError, match="controllers: expected ID@HOST:PORT"):
        config.load(None, {}, {"controllers": "nobody"})


@pytest.mark.parametrize("content", [b"listen = \"\xff\xfe\"\n", None])
def test_an_unreadable_config_file_is_one_line(tmp_path: Path, content):
    """A config file that is not UTF-8, or a directory, raises a one-line ConfigError naming the file."""
    file = tmp_path / "rocket.toml"
    if content is None:
        file.mkdir()
    else:
        file.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        config.load(file, {}, {})
    assert str(file) in str(caught.value) and "\n" not in str(caught.value)


RANGED = [field for field in dataclasses.fields(config.NodeConfig) if "range" in field.metadata]


def test_every_ranged_setting_defaults_within_its_range():
    """A number setting's range sits on its field (config.ranged); its default is one a config may set."""
    assert len(RANGED) >= 15
    for field in RANGED:
        low, high = field.metadata["range"]
        assert low <= field.default <= high, field.name
        assert type(field.default) is float or type(low) is type(high) is int, field.name  # an integer setting
    piece = next(field for field in RANGED if field.name == "tier_piece_bytes")
    assert piece.metadata["range"][1] <= limits.object_bytes_max, "a piece is one object"


@pytest.mark.parametrize("field", RANGED, ids=lambda field: field.name)
def test_a_ranged_setting_takes_its_bounds_and_refuses_past_them_naming_the_range(field):
    low, high = field.metadata["range"]
    for value in (low, high):
        assert getattr(config.load(None, {f"ROCKET_{field.name.upper()}": str(value)}, {}), field.name) == value
    past = high * 2 + 1
    with pytest.raises(ConfigError) as refused:
        config.load(None, {f"ROCKET_{field.name.upper()}": str(past)}, {})
    assert str(refused.value).endswith(f"{field.name}: must be between {low} and {high}, got {str(past)!r}")
