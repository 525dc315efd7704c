"""The TLS settings (tls_cert, tls_key, tls_ca, tls_mode): from a file or the environment, checked when loaded, and
one ConfigError line naming the key for every bad one; and the contexts NodeTls builds from them."""

from pathlib import Path

import pytest
import trustme

from rocket import config
from rocket.config import ConfigError
from rocket.transport.tls import NodeTls


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = {"cert": tmp_path / "node.pem", "key": tmp_path / "node.key", "ca": tmp_path / "ca.pem",
             "other_key": tmp_path / "other.key", "junk": tmp_path / "junk.pem"}
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(paths["other_key"]))
    paths["junk"].write_text("not PEM at all\n")
    return paths


def env(**paths: Path | str) -> dict[str, str]:
    return {f"ROCKET_{name.upper()}": str(value) for name, value in paths.items()}


def test_tls_settings_load_from_the_environment_and_a_file(files, tmp_path: Path):
    loaded = config.load(None, env(tls_cert=files["cert"], tls_key=files["key"], tls_ca=files["ca"],
                                   tls_mode="Permissive"), {})
    assert (loaded.tls_cert, loaded.tls_key, loaded.tls_ca, loaded.tls_mode) == (
        files["cert"], files["key"], files["ca"], "permissive")
    file = tmp_path / "rocket.toml"
    file.write_text(f'tls_cert = "{files["cert"]}"\ntls_key = "{files["key"]}"\n')
    from_file = config.load(file, {}, {})
    assert (from_file.tls_cert, from_file.tls_ca, from_file.tls_mode) == (files["cert"], None, "enforcing")


@pytest.mark.parametrize("settings, named", [
    ({"tls_cert": "cert"}, "tls_cert: TLS needs both tls_cert and tls_key"),
    ({"tls_key": "key"}, "tls_cert: TLS needs both"),
    ({"tls_cert": "cert", "tls_key": "other_key"}, "tls_cert: cannot load"),  # a key that is not the certificate's
    ({"tls_cert": "junk", "tls_key": "key"}, "tls_cert: cannot load"),
    ({"tls_cert": "missing", "tls_key": "key"}, "is not a file"),
    ({"tls_ca": "ca"}, "tls_ca: mutual TLS needs this node's own certificate"),
    ({"tls_cert": "cert", "tls_key": "key", "tls_ca": "junk"}, "tls_ca: cannot load"),
    ({"tls_mode": "strict"}, "tls_mode: expected one of enforcing, permissive"),
    ({"http2_tls_cert": "cert", "http2_tls_key": "other_key"}, "http2_tls_cert: cannot load"),
])
def test_bad_tls_settings_name_their_key(files, tmp_path: Path, settings, named):
    values = {key: value if key == "tls_mode" else files.get(value, tmp_path / value) for key, value in settings.items()}
    with pytest.raises(ConfigError) as caught:
        config.load(None, env(**values), {})
    assert named in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_node_tls_builds_each_context_and_keeps_them_when_a_reload_fails(files):
    plain = NodeTls(config.load(None, {}, {}))
    assert (plain.tcp, plain.http2, plain.peer, plain.plain_accepted, plain.verifies_peers) == (
        None, None, None, True, False)
    loaded = config.load(None, env(tls_cert=files["cert"], tls_key=files["key"], tls_ca=files["ca"]), {})
    tls = NodeTls(loaded)
    assert tls.tcp is not None and tls.http2 is not None and tls.http1 is not None and tls.peer is not None
    assert (tls.plain_accepted, tls.verifies_peers) == (False, True)
    assert tls.tcp.minimum_version.name == "TLSv1_2" and tls.peer.check_hostname
    contexts = (tls.tcp, tls.http2, tls.peer)
    assert tls.reload() and (tls.tcp, tls.http2, tls.peer) != contexts  # new contexts for new connections
    contexts = (tls.tcp, tls.http2, tls.peer)
    files["cert"].write_text("rotated badly\n")
    assert not tls.reload() and (tls.tcp, tls.http2, tls.peer) == contexts
