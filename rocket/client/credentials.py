"""A client's credentials: an access key (user) and its secret, from the caller, the environment or the credentials
file, in that order (load_credentials). With none, a client connects unsigned, which a server with auth off serves."""

from __future__ import annotations

import os
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path

from rocket.access import Credentials
from rocket.errors import Code, RocketError

DEFAULT_FILE = Path("~/.config/rocket/credentials")


def load_credentials(environment: Mapping[str, str] = os.environ) -> Credentials | None:
    """The credentials of the environment (ROCKET_USER and ROCKET_SECRET), else of the credentials file
    (ROCKET_CREDENTIALS, else ~/.config/rocket/credentials: TOML with `user` and `secret`); None without any."""
    user, secret = environment.get("ROCKET_USER", ""), environment.get("ROCKET_SECRET", "")
    if user or secret:
        if not (user and secret):
            raise RocketError(Code.BAD_REQUEST, "credentials: ROCKET_USER and ROCKET_SECRET go together")
        return Credentials(user, secret)
    path = Path(environment.get("ROCKET_CREDENTIALS", "") or DEFAULT_FILE).expanduser()
    if not path.is_file():
        return None
    try:
        found = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise RocketError(Code.BAD_REQUEST, f"credentials: cannot read {path}: {error}") from None
    if not isinstance(found.get("user"), str) or not isinstance(found.get("secret"), str):
        raise RocketError(Code.BAD_REQUEST, f"credentials: {path} needs user = \"...\" and secret = \"...\"")
    return Credentials(found["user"], found["secret"])


def hello_of(credentials: Credentials | None):
    """The first call of each connection (Authenticate), made fresh for each: None without credentials."""
    if credentials is None:
        return None
    return lambda: credentials.hello(int(time.time() * 1000))
