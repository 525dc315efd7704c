"""RocketMQ 5's gRPC signature, verified (pure: the caller passes the secrets and the time): an HMAC-SHA1 of the
x-mq-date-time header in the authorization header (verify_grpc), checked more strictly than apache/rocketmq's proxy
where no official client differs.
"""

from __future__ import annotations

import binascii
import datetime
import hashlib
import hmac
import re
from collections.abc import Callable

from rocket import limits
from rocket.errors import Code, RocketError

AUTHORIZATION_KEY = "authorization"
DATE_TIME_KEY = "x-mq-date-time"
SESSION_TOKEN_KEY = "x-mq-session-token"  # sent with STS credentials; neither signed nor checked by apache/rocketmq
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# A refused call gets, from apache/rocketmq's proxy, gRPC status OK and a response whose Status is
# apache.rocketmq.v2.Code.UNAUTHORIZED (40100) with the message (proxy/.../grpc/v2/common/ResponseBuilder.buildStatus:
# AuthenticationException and AuthorizationException alike; a Telemetry stream gets a TelemetryCommand with that
# Status); the clients raise UnauthorizedException for it. DENIED_STATUS names that code.
DENIED_STATUS = 40100  # apache.rocketmq.v2.Code.UNAUTHORIZED, in the response's Status (the gRPC status stays OK)

_DATE_TIME = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z", re.ASCII)
_SIGNATURE_HEX = re.compile(r"[0-9A-Fa-f]{40}", re.ASCII)  # an HMAC-SHA1 is 20 bytes
_ITEMS = ("Credential", "SignedHeaders", "Signature")
_USAGE = f"expected '{ALGORITHM} Credential=AK, SignedHeaders={DATE_TIME_KEY}, Signature=HEX'"


def sign_grpc(secret: bytes, date_time: str) -> str:
    """The Signature item's value, in lower-case hex (as the Python client writes it)."""
    return hmac.new(secret, date_time.encode(), hashlib.sha1).hexdigest()


def verify_grpc(metadata: dict[str, str], secret_of: Callable[[str], bytes | None], now_ms: int) -> str:
    """The access key of a call whose authorization header is valid now; else RocketError(UNAUTHENTICATED) saying
    why. secret_of(access_key) is that key's secret, or None for a key no user has.

    What the official clients send (apache/rocketmq-clients: java/.../rpc/Signature.java, python/rocketmq/v5/util/
    signature.py, golang/client.go Sign, csharp/.../Signature.cs, cpp/source/client/Signature.cpp, nodejs/src/util):

        x-mq-date-time: 20210309T195445Z                      (strftime %Y%m%dT%H%M%SZ)
        authorization:  MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>
        x-mq-session-token: <token>                           (only with an STS token; not signed)

    Signature is HMAC-SHA1, keyed with the secret's UTF-8 bytes, of the x-mq-date-time value's bytes, in hex (Python
    lower case, Node.js and C# upper case). Only the time is signed: not the method, the request, the session token
    or a nonce, so a captured header replays for as long as its time is accepted. The Java, Python, Go and C# clients
    format their local time with a literal Z (only C++ and Node.js sign UTC), hence the wide window in limits/rocketmq.py.

    apache/rocketmq's proxy (auth/.../DefaultAuthenticationContextBuilder.build(Metadata, ...), ACL 2.0; acl/.../
    AuthorizationHeader and PlainAccessResource.parse in ACL 1.0) splits the header at its first space, then its
    items at commas, trims each and splits it at its first '='; the access key is Credential's value up to any '/';
    Signature is hex-decoded and compared (as base64) with the HMAC of x-mq-date-time under the user's secret
    (DefaultAuthenticationHandler: "check signature failed."). It never bounds the time, ignores SignedHeaders and
    the scheme word, and does not check the session token. This check is stricter where no official client differs:
    the scheme must be MQv2-HMAC-SHA1, SignedHeaders must be x-mq-date-time, the signature 40 hex digits, no item
    repeated, and the time within limits.rocketmq_signature_{ahead,behind}_s_max of now."""
    authorization = metadata.get(AUTHORIZATION_KEY)
    if not authorization or not isinstance(authorization, str):
        raise _denied(f"no authorization header: {_USAGE}")
    access_key, signature = _parse(authorization)
    date_time = metadata.get(DATE_TIME_KEY)
    if not date_time or not isinstance(date_time, str):
        raise _denied(f"no {DATE_TIME_KEY} header: the authorization signs it")
    secret = secret_of(access_key)
    if secret is None:
        raise _denied(f"unknown access key {_excerpt(access_key)}")
    expected = hmac.new(secret, date_time.encode("utf-8", "replace"), hashlib.sha1).digest()
    if not hmac.compare_digest(expected, signature):
        raise _denied(f"the signature does not match access key {_excerpt(access_key)}'s secret")
    match = _DATE_TIME.fullmatch(date_time)
    try:
        if match is None:
            raise ValueError
        signed_ms = int(datetime.datetime(*map(int, match.groups()), tzinfo=datetime.timezone.utc).timestamp()) * 1000
    except (ValueError, OverflowError):
        raise _denied(f"{DATE_TIME_KEY} {_excerpt(date_time)} is not a time in the format "
                      f"{DATE_TIME_FORMAT}") from None
    if not -limits.rocketmq_signature_behind_s_max * 1000 <= signed_ms - now_ms <= limits.rocketmq_signature_ahead_s_max * 1000:
        raise _denied(f"{DATE_TIME_KEY} {date_time} is further from the server's clock than any time zone and "
                      f"{limits.rocketmq_signature_clock_error_s_max / 60:g} min of clock error explain")
    return access_key


def _parse(authorization: str) -> tuple[str, bytes]:
    """(access key, signature bytes) from the authorization header, or a RocketError saying what is wrong."""
    scheme, _, rest = authorization.partition(" ")
    if scheme != ALGORITHM:
        raise _denied(f"malformed authorization header: the scheme is not {ALGORITHM}; {_USAGE}")
    items: dict[str, str] = {}
    for item in rest.split(","):
        name, equals, value = item.strip(" \t").partition("=")
        if not equals:
            raise _denied(f"malformed authorization header: {_excerpt(item.strip())} is not NAME=VALUE; {_USAGE}")
        if name in items:
            raise _denied(f"malformed authorization header: {name} twice; {_USAGE}")
        items[name] = value
    missing = [name for name in _ITEMS if name not in items]
    if missing:
        raise _denied(f"malformed authorization header: no {', '.join(missing)}; {_USAGE}")
    access_key = items["Credential"].split("/", 1)[0]  # Credential=AK or AK/..., as apache/rocketmq reads it
    if not access_key:
        raise _denied(f"malformed authorization header: Credential names no access key; {_USAGE}")
    if items["SignedHeaders"] != DATE_TIME_KEY:
        raise _denied(f"malformed authorization header: SignedHeaders is {_excerpt(items['SignedHeaders'])}, not "
                      f"{DATE_TIME_KEY}, the one header RocketMQ clients sign")
    if not _SIGNATURE_HEX.fullmatch(items["Signature"]):
        raise _denied("malformed authorization header: Signature is not 40 hex digits (an HMAC-SHA1)")
    return access_key, binascii.unhexlify(items["Signature"])


def _denied(message: str) -> RocketError:
    return RocketError(Code.UNAUTHENTICATED, message)


def _excerpt(text: str) -> str:
    """A quoted value for a message: at most limits.error_excerpt_chars_max characters, printable."""
    shown = text if len(text) <= limits.error_excerpt_chars_max else text[:limits.error_excerpt_chars_max] + "..."
    return repr(shown)
