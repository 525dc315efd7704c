"""The remoting protocol's ACL signature (RocketMQ 4.x ACL, 5.x ACL 2.0, ali-ons), verified (pure): HMAC-SHA1 over the
values of every ext field but Signature and the body (signed_content), checked as apache/rocketmq's broker checks it
(verify_remoting).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable

from rocket import limits
from rocket.errors import Code, RocketError

ACCESS_KEY = "AccessKey"  # SessionCredentials.ACCESS_KEY
SIGNATURE = "Signature"  # SessionCredentials.SIGNATURE
SECURITY_TOKEN = "SecurityToken"  # SessionCredentials.SECURITY_TOKEN: signed with the rest, never checked
ONS_CHANNEL = "OnsChannel"  # ali-ons's, always 'ALIYUN': signed with the rest
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG
VERSION_4_9_3 = 399  # MQVersion.Version.V4_9_3.ordinal(): clients up to it did not sign _UNIQUE_KEY_QUERY
# A refused request gets, from apache/rocketmq's broker, the response code SYSTEM_ERROR (1) with the exception's text
# as remark (remoting/.../NettyRemotingAbstract.processRequestCommand's catch); NO_PERMISSION (16) is what it answers
# for a permission a known user lacks (e.g. a topic not writable). DENIED_CODE names the former.
DENIED_CODE = 1  # RemotingSysResponseCode.SYSTEM_ERROR, what apache/rocketmq answers a failed authentication


def signed_content(ext_fields: dict[str, str], body: bytes, version: int) -> bytes:
    """The bytes the signature covers (AclUtils.combineRequestContent over the ext fields as the broker filters
    them): the values of every ext field but Signature, in Java's key order, UTF-8, then the body."""
    names = sorted((name for name in ext_fields
                    if name != SIGNATURE and not (name == UNIQUE_KEY_QUERY and version <= VERSION_4_9_3)),
                   key=_java_order)
    # Java's getBytes(UTF_8) writes '?' for an unpaired surrogate, as Python's "replace" does.
    return "".join(ext_fields[name] for name in names).encode("utf-8", "replace") + (body or b"")


def sign_remoting(ext_fields: dict[str, str], body: bytes, secret: bytes, version: int) -> str:
    """The Signature ext field's value for these fields (Signature itself ignored) and body."""
    return base64.b64encode(hmac.new(secret, signed_content(ext_fields, body, version), hashlib.sha1).digest()).decode()


def verify_remoting(ext_fields: dict[str, str], body: bytes, secret_of: Callable[[str], bytes | None], *,
                    version: int) -> str:
    """The access key of a request whose Signature is valid; else RocketError(UNAUTHENTICATED) saying why.
    version is the request header's (RemotingCommand.version); secret_of(access_key) is that key's secret, or None
    for a key no user has. Remoting signatures carry no time: a captured request replays as it is.

    The signer (apache/rocketmq client/.../acl/common/AclClientRPCHook.doBeforeRequest) adds the ext fields
    AccessKey and, with STS credentials, SecurityToken, then signs every ext field but Signature (the custom header's
    fields, as makeCustomHeaderToNet writes them) in key order (a TreeMap: Java's String order, by UTF-16 code unit):
    the values alone, no keys or separators, concatenated, UTF-8, then the body's bytes
    (AclUtils.combineRequestContent), under HMAC-SHA1 keyed with the secret's UTF-8 bytes, in base64 with padding
    (AclUtils.calSignature -> AclSigner), and sends it as the ext field Signature.

    ali-ons 3.12.0 (lib/channel.js beforeRequest) signs the same way: the map AccessKey, OnsChannel (always 'ALIYUN')
    and each custom-header field that is not null, values as toString(), sorted by key (JavaScript's default sort,
    also UTF-16 code units), their values concatenated, UTF-8, then the body; HMAC-SHA1 under the secret key, base64;
    and sends Signature, AccessKey and OnsChannel as ext fields beside the header's. OnsChannel is thus one more
    signed field.

    The verifier (apache/rocketmq 5.x auth/.../DefaultAuthenticationContextBuilder.build(ChannelHandlerContext, ...),
    ACL 2.0; acl/.../PlainAccessResource.parse in ACL 1.0) rebuilds the content from the ext fields it received: all
    but Signature, and but _UNIQUE_KEY_QUERY from a client whose header version is at most V4_9_3 (whose hook signed
    only the custom header, while queryMessage adds that field outside it; 4.9.4's broker skipped it from every
    version), plus the body, and compares the base64 string exactly (DefaultAuthenticationHandler; "check signature
    failed."). A request with no AccessKey is anonymous there (refused when authentication is on: "username cannot
    be null."). SecurityToken is signed like any field but never checked."""
    access_key = ext_fields.get(ACCESS_KEY)
    if not access_key or not isinstance(access_key, str):
        raise _denied(f"no {ACCESS_KEY} ext field: the request is not signed (set the client's access key and secret)")
    signature = ext_fields.get(SIGNATURE)
    if not signature or not isinstance(signature, str):
        raise _denied(f"no {SIGNATURE} ext field beside {ACCESS_KEY} {_excerpt(access_key)}")
    secret = secret_of(access_key)
    if secret is None:
        raise _denied(f"unknown access key {_excerpt(access_key)}")
    expected = sign_remoting(ext_fields, body, secret, version).encode()
    if not hmac.compare_digest(expected, signature.encode("utf-8", "replace")):
        raise _denied(f"the signature does not match access key {_excerpt(access_key)}'s secret "
                      "(HMAC-SHA1 over the sorted ext field values and the body)")
    return access_key


def _java_order(name: str) -> bytes:
    """A key for Java's String.compareTo (and JavaScript's sort): UTF-16 code units, not code points."""
    return name.encode("utf-16-be", "surrogatepass")


def _denied(message: str) -> RocketError:
    return RocketError(Code.UNAUTHENTICATED, message)


def _excerpt(text: str) -> str:
    """A quoted value for a message: at most limits.error_excerpt_chars_max characters, printable."""
    shown = text if len(text) <= limits.error_excerpt_chars_max else text[:limits.error_excerpt_chars_max] + "..."
    return repr(shown)
