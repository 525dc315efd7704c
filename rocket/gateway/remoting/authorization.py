"""Who may make a remoting request, with auth on (authorize): the request's AccessKey and Signature (signature.py) name
the user, and its code what it needs of rocket's policies (rocket/access.py), as NEEDS says."""

from __future__ import annotations

from rocket.access import Access
from rocket.errors import RocketError
from rocket.gateway.remoting.codec import Command, RequestCode
from rocket.gateway.remoting.signature import verify_remoting

code = RequestCode
# request code -> (action, the ext fields naming its topics, the ext fields naming its consumer groups), as
# apache/rocketmq's broker checks each request code against ACL 2.0's resources. Codes not listed need only a signed
# request: route and cluster lookups, heartbeats, and what names no topic in its header (VIEW_MESSAGE_BY_ID,
# END_TRANSACTION, queue locks).
NEEDS: dict[int, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    code.SEND_MESSAGE: ("pub", ("topic",), ()),
    code.SEND_MESSAGE_V2: ("pub", ("b",), ()),  # SendMessageRequestHeaderV2's one-letter names: b is the topic
    code.SEND_BATCH_MESSAGE: ("pub", ("b",), ()),
    code.PULL_MESSAGE: ("sub", ("topic",), ("consumerGroup",)),
    code.QUERY_CONSUMER_OFFSET: ("sub", ("topic",), ("consumerGroup",)),
    code.UPDATE_CONSUMER_OFFSET: ("sub", ("topic",), ("consumerGroup",)),
    code.CONSUMER_SEND_MSG_BACK: ("sub", ("originTopic",), ("group",)),
    code.GET_MAX_OFFSET: ("sub", ("topic",), ()),
    code.GET_MIN_OFFSET: ("sub", ("topic",), ()),
    code.SEARCH_OFFSET_BY_TIMESTAMP: ("sub", ("topic",), ()),
    code.GET_EARLIEST_MSG_STORETIME: ("sub", ("topic",), ()),
    code.QUERY_MESSAGE: ("sub", ("topic",), ()),
    code.UPDATE_AND_CREATE_TOPIC: ("admin", ("topic",), ()),
    code.DELETE_TOPIC_IN_BROKER: ("admin", ("topic",), ()),
}


def authorize(access: Access, command: Command, source: str) -> str:
    """The user a request is signed by, if it may make it; else RocketError UNAUTHENTICATED or PERMISSION_DENIED."""
    try:
        user = verify_remoting(command.ext, command.body, access.secret_of, version=command.version)
    except RocketError as error:
        raise access.failed(source, error) from None
    needs = NEEDS.get(command.code)
    if needs is not None:
        action, topics, groups = needs
        access.authorize(user, [(action, f"topic:{command.ext[field]}") for field in topics if command.ext.get(field)]
                         + [(action, f"group:{command.ext[field]}") for field in groups if command.ext.get(field)],
                         source)
    return user
