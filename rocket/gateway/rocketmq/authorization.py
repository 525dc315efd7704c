"""What a RocketMQ 5 gRPC call needs of rocket's policies (rocket/access.py), with auth on: sends publish to their
messages' topics; receives, acks, pulls and offsets subscribe to their topic as their consumer group. Routes,
heartbeats, assignments' lookups and telemetry need only a valid signature (signature.py)."""

from __future__ import annotations

ACTIONS = {
    "SendMessage": "pub", "EndTransaction": "pub", "RecallMessage": "pub",
    **{name: "sub" for name in ("ReceiveMessage", "AckMessage", "ChangeInvisibleDuration",
                                "ForwardMessageToDeadLetterQueue", "PullMessage", "UpdateOffset", "GetOffset",
                                "QueryOffset")},
}


def grpc_needs(method: str, request) -> list[tuple[str, str]]:
    """The (action, resource) pairs a call needs, read from its request's topic, group, queue and messages."""
    action = ACTIONS.get(method)
    if action is None:
        return []
    present = {field.name for field, _ in request.ListFields()}
    topics = set()
    if "topic" in present:
        topics.add(request.topic.name)
    if "message_queue" in present:
        topics.add(request.message_queue.topic.name)
    if "messages" in present:
        topics.update(message.topic.name for message in request.messages)
    needs = [(action, f"topic:{topic}") for topic in sorted(topics)]
    if "group" in present and request.group.name:
        needs.append((action, f"group:{request.group.name}"))
    return needs
