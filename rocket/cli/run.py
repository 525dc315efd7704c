"""`rocket run`: start a node from its config, environment and flags."""

from __future__ import annotations

import faulthandler
import functools
import logging
from pathlib import Path
from typing import Annotated, Optional

import trio
import typer

from rocket import limits
from rocket.config import ConfigError, load_from_environment
from rocket.errors import RocketError, collapse_single_error


def fail(message: str, status: int) -> None:
    """common.fail, imported only when a node fails to start: common brings in the client, which a node's start
    does without."""
    from rocket.cli.common import fail as fail_with

    fail_with(message, status)


def run(
    role: Annotated[Optional[str], typer.Option("--role", help="all (nameserver, storage and broker), or a comma-separated list of nameserver, storage, broker, controller.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML config file.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Where data lives (default ./rocket-data).")] = None,
    listen: Annotated[Optional[str], typer.Option("--listen", help="TCP HOST:PORT (default 127.0.0.1:9876).")] = None,
    http2_listen: Annotated[Optional[str], typer.Option("--http2-listen", help="HTTP/2 HOST:PORT or 'off' (default 127.0.0.1:9877).")] = None,
    http_listen: Annotated[Optional[str], typer.Option("--http-listen", help="HTTP/1.1 (/metrics, /healthz, /readyz) HOST:PORT or 'off' (default: 127.0.0.1:9878 in dev mode, off in a cluster).")] = None,
    mqtt_listen: Annotated[Optional[str], typer.Option("--mqtt-listen", help="MQTT HOST:PORT on brokers, or 'off' (the default).")] = None,
    log_level: Annotated[Optional[str], typer.Option("--log-level", help="debug, info, warning or error (default info).")] = None,
    node_id: Annotated[Optional[int], typer.Option("--node-id", help="This node's id in the cluster (default 1).")] = None,
    nameservers: Annotated[Optional[str], typer.Option("--nameservers", help="ID@HOST:PORT,... of the nameserver group (default: this node alone).")] = None,
    controllers: Annotated[Optional[str], typer.Option("--controllers", help="ID@HOST:PORT,... of the standalone controller group (default: none; the nameservers' embedded controller).")] = None,
    advertise: Annotated[Optional[str], typer.Option("--advertise", help="HOST:PORT other nodes reach this one at (default: --listen).")] = None,
    auth: Annotated[Optional[bool], typer.Option("--auth/--no-auth", help="Every client call needs a user the policies allow (needs cluster_secret).")] = None,
) -> None:
    """Run a node. With no flags: dev mode, all roles in one process, data in ./rocket-data."""
    from rocket.node import StartupError, keep_freed_memory, run_node, stop_reason, tune_collector

    flags = {"roles": role, "data_dir": data_dir, "listen": listen, "http2_listen": http2_listen, "http_listen": http_listen, "mqtt_listen": mqtt_listen,
             "log_level": log_level,
             "node_id": node_id, "nameservers": nameservers, "controllers": controllers,
             "advertise": advertise, "auth": auth}
    try:
        node_config = load_from_environment(config, flags)
    except ConfigError as error:
        fail(f"config: {error}", 2)
    logging.basicConfig(level=node_config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    faulthandler.enable()  # a node killed by a fatal signal (a crash in C code) leaves its threads' stacks in its log
    kept = keep_freed_memory(pretouch_bytes=0)  # the node touches the heap once it is ready
    tune_collector()
    try:
        with collapse_single_error():
            trio.run(functools.partial(run_node, node_config, freeze_startup=True,
                                       pretouch_bytes=limits.malloc_pretouch_bytes if kept else 0))
    except RocketError as error:
        fail(f"{error.code.name}: {error.message}", 2 if error.code.name == "CONFIG_INVALID" else 1)
    except ConfigError as error:  # found once the node starts: a tier backend without its client library
        fail(f"config: {error}", 2)
    except StartupError as error:
        fail(f"cannot start: {error}", 1)
    except (OSError, ExceptionGroup) as error:
        reason = stop_reason(error)
        if reason is not None:  # the store's LevelDB, say, which a full disk stopped: systemd starts it again
            fail(reason, 1)
        if isinstance(error, ExceptionGroup):
            raise
        # Not a port or data directory problem (StartupError): where it came from is the news.
        logging.getLogger("rocket").error("the node stopped on an error it did not expect", exc_info=error)
        fail(f"cannot start: {error}", 1)
