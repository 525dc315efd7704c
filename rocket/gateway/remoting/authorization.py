"""Who makes a remoting request, with auth on (signed_by): its AccessKey and Signature (signature.py) name the user.
What the user may do is decided where each node method the request makes is called, as that user (Dispatcher)."""

from __future__ import annotations

from rocket.access import Access
from rocket.errors import RocketError
from rocket.gateway.remoting.codec import Command, RequestCode
from rocket.gateway.remoting.signature import verify_remoting

code = RequestCode
# request code -> the ext field naming the topic its client quota is charged to; the others are charged to none.
QUOTA_TOPIC: dict[int, str] = {
    code.SEND_MESSAGE: "topic", code.SEND_MESSAGE_V2: "b", code.SEND_BATCH_MESSAGE: "b",  # V2's b is the topic
    **{request: "topic" for request in (
        code.PULL_MESSAGE, code.QUERY_CONSUMER_OFFSET, code.UPDATE_CONSUMER_OFFSET, code.GET_MAX_OFFSET,
        code.GET_MIN_OFFSET, code.SEARCH_OFFSET_BY_TIMESTAMP, code.GET_EARLIEST_MSG_STORETIME, code.QUERY_MESSAGE,
        code.UPDATE_AND_CREATE_TOPIC, code.DELETE_TOPIC_IN_BROKER, code.DELETE_TOPIC_IN_NAMESRV)},
    code.CONSUMER_SEND_MSG_BACK: "originTopic",
}
PRODUCING = frozenset({code.SEND_MESSAGE, code.SEND_MESSAGE_V2, code.SEND_BATCH_MESSAGE})  # quotas count their body


def signed_by(access: Access, command: Command, source: str) -> str:
    """The user a request is signed by; else RocketError UNAUTHENTICATED, counted against the source."""
    try:
        return verify_remoting(command.ext, command.body, access.secret_of, version=command.version)
    except RocketError as error:
        raise access.failed(source, error) from None
