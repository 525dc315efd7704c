"""The signatures RocketMQ clients send, verified: gRPC's MQv2-HMAC-SHA1 (signed by rocketmq-python-client's own
code) and the remoting ACL's (signed by the 4.x Java hook's algorithm, reproduced, and by ali-ons's own function
under node)."""

from __future__ import annotations

import base64
import calendar
import datetime
import functools
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.remoting.signature import VERSION_4_9_3, sign_remoting, signed_content, verify_remoting
from rocket.gateway.rocketmq.signature import DENIED_STATUS, sign_grpc, verify_grpc

AK, SK = "rocket-ak", b"rocket-secret-key"
SECRETS = {AK: SK, "other-ak": b"another secret"}
secret_of = SECRETS.get
SIGNED_AT = datetime.datetime(2024, 3, 9, 19, 54, 45)  # the client's wall clock: naive, as the clients format it
NOW_MS = calendar.timegm(SIGNED_AT.timetuple()) * 1000  # the server's clock, in UTC


def refused(call, *words: str) -> RocketError:
    with pytest.raises(RocketError) as caught:
        call()
    assert caught.value.code == Code.UNAUTHENTICATED
    assert "\n" not in caught.value.message
    for word in words:
        assert word in caught.value.message
    return caught.value


# gRPC -------------------------------------------------------------------------------------------------------------

def client_metadata(access_key: str = AK, secret: str = SK.decode(), at: datetime.datetime = SIGNED_AT) -> dict:
    """The metadata rocketmq-python-client's Signature.metadata sends, its clock set to `at`."""
    from rocketmq.v5.client import ClientConfiguration, Credentials
    from rocketmq.v5.util import signature as client_signature

    class FixedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return at

    original = client_signature.datetime
    client_signature.datetime = FixedClock
    try:
        config = ClientConfiguration("127.0.0.1:8081", Credentials(access_key, secret))
        return dict(client_signature.Signature.metadata(config, "client-id"))
    finally:
        client_signature.datetime = original


def test_the_official_python_client_is_accepted():
    metadata = client_metadata()
    assert metadata["x-mq-date-time"] == "20240309T195445Z"
    assert metadata["authorization"].startswith("MQv2-HMAC-SHA1 Credential=rocket-ak, SignedHeaders=x-mq-date-time, ")
    assert verify_grpc(metadata, secret_of, NOW_MS) == AK


def test_the_clients_own_sign_function_matches_ours_and_cpps_vector():
    """Signature.sign is the client's helper; the vector is rocketmq-clients' cpp TlsHelperTest (case-insensitive)."""
    from rocketmq.v5.util.signature import Signature
    assert Signature.sign("sk", "20240309T195445Z") == sign_grpc(b"sk", "20240309T195445Z")
    assert (sign_grpc(b"arbitrary-access-key", "some random data for test purpose only")
            == "567868dc8e81f1e8095f88958edff1e07db4290e")


def test_upper_case_hex_as_node_and_csharp_send_is_accepted():
    metadata = client_metadata()
    head, _, signature = metadata["authorization"].rpartition("=")
    metadata["authorization"] = head + "=" + signature.upper()
    assert verify_grpc(metadata, secret_of, NOW_MS) == AK


def test_credential_with_a_scope_and_a_session_token_is_accepted():
    """apache/rocketmq takes the access key up to any '/'; the session token is neither signed nor checked."""
    metadata = client_metadata()
    metadata["authorization"] = metadata["authorization"].replace("Credential=rocket-ak,", "Credential=rocket-ak/x/y,")
    metadata["x-mq-session-token"] = "anything"
    assert verify_grpc(metadata, secret_of, NOW_MS) == AK


def test_a_replay_within_the_window_is_accepted():
    """Only x-mq-date-time is signed (no request, no nonce): the same headers pass again, an hour later, for any call."""
    metadata = client_metadata()
    assert verify_grpc(metadata, secret_of, NOW_MS) == AK
    assert verify_grpc(dict(metadata), secret_of, NOW_MS + 3600_000) == AK


@pytest.mark.parametrize("zone_hours", [-12, -5, 0, 5.75, 8, 14])
def test_clients_that_sign_local_time_labelled_z_are_accepted_in_every_zone(zone_hours):
    """Java, Python, Go and C# clients format their local time with a literal Z."""
    local = SIGNED_AT + datetime.timedelta(hours=zone_hours)
    assert verify_grpc(client_metadata(at=local), secret_of, NOW_MS) == AK


@pytest.mark.parametrize("offset_s", [limits.rocketmq_signature_ahead_s_max + 1, -limits.rocketmq_signature_behind_s_max - 1,
                                      -7 * 86_400])
def test_a_time_outside_the_window_is_refused(offset_s):
    metadata = client_metadata(at=SIGNED_AT + datetime.timedelta(seconds=offset_s))
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "x-mq-date-time", "clock")


def test_the_window_edges_are_accepted():
    for offset_s in (limits.rocketmq_signature_ahead_s_max, -limits.rocketmq_signature_behind_s_max):
        metadata = client_metadata(at=SIGNED_AT + datetime.timedelta(seconds=offset_s))
        assert verify_grpc(metadata, secret_of, NOW_MS) == AK


def test_a_tampered_signature_is_refused():
    metadata = client_metadata()
    head, _, signature = metadata["authorization"].rpartition("=")
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    metadata["authorization"] = head + "=" + flipped
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "signature does not match", AK)


def test_a_tampered_time_is_refused():
    metadata = client_metadata()
    metadata["x-mq-date-time"] = "20240309T195446Z"
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "signature does not match")


def test_another_users_credential_is_refused():
    metadata = client_metadata()
    metadata["authorization"] = metadata["authorization"].replace("Credential=rocket-ak", "Credential=other-ak")
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "signature does not match", "other-ak")


def test_a_wrong_secret_is_refused():
    metadata = client_metadata(secret="not the secret")
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "signature does not match")


def test_an_unknown_access_key_is_refused():
    metadata = client_metadata(access_key="nobody")
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "unknown access key", "nobody")


def test_every_truncation_of_the_header_is_refused():
    authorization = client_metadata()["authorization"]
    for length in range(len(authorization)):
        metadata = client_metadata()
        metadata["authorization"] = authorization[:length]
        refused(lambda: verify_grpc(metadata, secret_of, NOW_MS))


def test_missing_headers_are_refused():
    metadata = client_metadata()
    refused(lambda: verify_grpc({k: v for k, v in metadata.items() if k != "authorization"}, secret_of, NOW_MS),
            "no authorization header")
    refused(lambda: verify_grpc({k: v for k, v in metadata.items() if k != "x-mq-date-time"}, secret_of, NOW_MS),
            "no x-mq-date-time")


@pytest.mark.parametrize("authorization, words", [
    ("Bearer xyz", ["scheme"]),
    ("MQv2-HMAC-SHA256 Credential=rocket-ak, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40, ["scheme"]),
    ("MQv2-HMAC-SHA1 Credential=rocket-ak, Signature=" + "0" * 40, ["no SignedHeaders"]),
    ("MQv2-HMAC-SHA1 Credential=rocket-ak, SignedHeaders=host, Signature=" + "0" * 40, ["SignedHeaders"]),
    ("MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40, ["no access key"]),
    ("MQv2-HMAC-SHA1 Credential=a, Credential=b, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40, ["twice"]),
    ("MQv2-HMAC-SHA1 Credential=a, SignedHeaders=x-mq-date-time, Signature=" + "0" * 39 + "g", ["40 hex"]),
    ("MQv2-HMAC-SHA1 Credential=a, SignedHeaders=x-mq-date-time, Signature=" + "00 " * 20, ["40 hex"]),
])
def test_malformed_headers_are_refused(authorization, words):
    metadata = {"authorization": authorization, "x-mq-date-time": "20240309T195445Z"}
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "malformed", *words)


@pytest.mark.parametrize("date_time", ["2024-03-09T19:54:45Z", "20241309T195445Z", "20240309T195445", "١٢٣٤0309T195445Z",
                                       "00000101T000000Z"])
def test_an_unparsable_time_is_refused_even_when_signed(date_time):
    metadata = {"x-mq-date-time": date_time, "authorization": "MQv2-HMAC-SHA1 Credential=rocket-ak, "
                f"SignedHeaders=x-mq-date-time, Signature={sign_grpc(SK, date_time)}"}
    refused(lambda: verify_grpc(metadata, secret_of, NOW_MS), "not a time in the format %Y%m%dT%H%M%SZ")


def test_the_denied_status_is_rocketmqs_unauthorized():
    from rocket.gateway.rocketmq.protocol import load_protocol
    protocol = load_protocol()
    if protocol is None:
        pytest.skip("rocketmq-python-client's protobuf modules are not installed")
    assert DENIED_STATUS == protocol[0].Code.Value("UNAUTHORIZED")


header_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=120)
authorizations = st.one_of(
    header_text,
    st.builds(lambda *parts: "MQv2-HMAC-SHA1 " + ", ".join(f"{k}={v}" for k, v in zip(parts[::2], parts[1::2])),
              *[st.sampled_from(["Credential", "SignedHeaders", "Signature", "X", ""]), header_text] * 3),
    st.builds(lambda ak, sig: f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}",
              st.sampled_from([AK, "other-ak", "nobody", ""]), st.text("0123456789abcdefABCDEF", max_size=44)))


@settings(max_examples=400, deadline=None)
@given(authorization=authorizations, date_time=st.one_of(header_text, st.just("20240309T195445Z")),
       extra=st.dictionaries(header_text, header_text, max_size=3), now_ms=st.integers(-2**63, 2**63))
def test_garbage_headers_raise_only_unauthenticated(authorization, date_time, extra, now_ms):
    metadata = {**extra, "authorization": authorization, "x-mq-date-time": date_time}
    refused(lambda: verify_grpc(metadata, secret_of, now_ms))


# Remoting ---------------------------------------------------------------------------------------------------------

def java_acl_signature(ext_fields: dict[str, str], body: bytes | None, secret_key: str) -> str:
    """AclClientRPCHook.doBeforeRequest as in rocketmq 4.9.4+: a TreeMap of the ext fields (AccessKey added),
    AclUtils.combineRequestContent (values but Signature's, UTF-8, then the body), AclSigner.calSignature."""
    def compare_to(a: str, b: str) -> int:  # java.lang.String.compareTo: UTF-16 code units, then length
        units_a, units_b = a.encode("utf-16-be", "surrogatepass"), b.encode("utf-16-be", "surrogatepass")
        for i in range(0, min(len(units_a), len(units_b)), 2):
            difference = int.from_bytes(units_a[i:i + 2], "big") - int.from_bytes(units_b[i:i + 2], "big")
            if difference:
                return difference
        return len(units_a) - len(units_b)
    tree_map = sorted(ext_fields.items(), key=functools.cmp_to_key(lambda x, y: compare_to(x[0], y[0])))
    builder = "".join(value for key, value in tree_map if key != "Signature")
    total = builder.encode("utf-8")
    if body:
        total += body
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), total, hashlib.sha1).digest()).decode()


def send_fields() -> dict[str, str]:
    """SendMessageRequestHeaderV2's fields as a 4.x producer sends them (short names), plus the hook's AccessKey."""
    return {"a": "producer-group", "b": "TopicA", "c": "TBW102", "d": "4", "e": "2", "f": "0", "g": "1700000000000",
            "h": "0", "i": "KEYS\u0001k1\u0002UNIQ_KEY\u0001AC1100\u0002WAIT\u0001true\u0002", "j": "0",
            "k": "false", "m": "false", "AccessKey": AK}


def test_apaches_own_signer_vector():
    """AclSignerTest: calSignature("RocketMQ", "12345678") is IUc8rrO/0gDch8CjObLQsW2rsiA=."""
    assert signed_content({"AccessKey": "Rocket", "B": "MQ"}, b"", 0) == b"RocketMQ"
    assert sign_remoting({"AccessKey": "Rocket", "B": "MQ"}, b"", b"12345678", 0) == "IUc8rrO/0gDch8CjObLQsW2rsiA="


def test_a_java_client_signature_is_accepted():
    fields, body = send_fields(), b"hello \xff body"
    fields["Signature"] = java_acl_signature(fields, body, SK.decode())
    assert verify_remoting(fields, body, secret_of, version=453) == AK


def test_key_order_is_javas_utf16_order_not_code_points():
    """U+FFFD sorts after U+1F600 in code points but before it in UTF-16 (a surrogate pair starts at 0xD83D)."""
    fields = {"AccessKey": AK, "\ufffd": "x", "\U0001f600": "y", "SecurityToken": "sts"}
    fields["Signature"] = java_acl_signature(fields, None, SK.decode())
    assert verify_remoting(fields, b"", secret_of, version=453) == AK
    assert signed_content(fields, b"", 453).endswith(b"yx")


def test_unique_key_query_is_unsigned_only_up_to_4_9_3():
    fields = {"AccessKey": AK, "topic": "t", "key": "k", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "1"}
    fields["Signature"] = java_acl_signature(fields, None, SK.decode())
    fields["_UNIQUE_KEY_QUERY"] = "true"  # added after signing, as queryMessage did before 4.9.4
    assert verify_remoting(fields, b"", secret_of, version=VERSION_4_9_3) == AK
    refused(lambda: verify_remoting(fields, b"", secret_of, version=VERSION_4_9_3 + 1), "signature does not match")


def test_a_tampered_field_body_or_signature_is_refused():
    fields, body = send_fields(), b"hello"
    fields["Signature"] = java_acl_signature(fields, body, SK.decode())
    refused(lambda: verify_remoting({**fields, "b": "TopicB"}, body, secret_of, version=453), "signature does not match")
    refused(lambda: verify_remoting({**fields, "z": "1"}, body, secret_of, version=453), "signature does not match")
    refused(lambda: verify_remoting(fields, body + b"!", secret_of, version=453), "signature does not match")
    refused(lambda: verify_remoting(fields, b"", secret_of, version=453), "signature does not match")
    refused(lambda: verify_remoting({**fields, "Signature": fields["Signature"].rstrip("=")}, body, secret_of,
                                    version=453), "signature does not match")
    refused(lambda: verify_remoting({**fields, "AccessKey": "other-ak"}, body, secret_of, version=453),
            "signature does not match", "other-ak")


def test_unsigned_or_unknown_requests_are_refused():
    fields, body = send_fields(), b"hello"
    fields["Signature"] = java_acl_signature(fields, body, SK.decode())
    refused(lambda: verify_remoting({k: v for k, v in fields.items() if k != "AccessKey"}, body, secret_of, version=453),
            "no AccessKey")
    refused(lambda: verify_remoting({k: v for k, v in fields.items() if k != "Signature"}, body, secret_of, version=453),
            "no Signature")
    unknown = {**fields, "AccessKey": "nobody"}
    unknown["Signature"] = java_acl_signature(unknown, body, "whatever")
    refused(lambda: verify_remoting(unknown, body, secret_of, version=453), "unknown access key", "nobody")


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.one_of(st.sampled_from(["AccessKey", "Signature", "_UNIQUE_KEY_QUERY"]), st.text()),
                              st.text(), max_size=6),
       body=st.binary(max_size=64), version=st.integers(-2**15, 2**15))
def test_garbage_ext_fields_raise_only_unauthenticated(fields, body, version):
    refused(lambda: verify_remoting(fields, body, secret_of, version=version))


@settings(max_examples=100, deadline=None)
@given(fields=st.dictionaries(st.text(), st.text(), max_size=6), body=st.binary(max_size=64))
def test_any_fields_signed_the_java_way_are_accepted(fields, body):
    fields = {**fields, "AccessKey": AK}
    fields.pop("Signature", None)
    fields.pop("_UNIQUE_KEY_QUERY", None)
    fields["Signature"] = java_acl_signature(fields, body, SK.decode())
    assert verify_remoting(fields, body, secret_of, version=453) == AK
