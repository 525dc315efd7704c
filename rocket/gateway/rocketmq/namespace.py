"""RocketMQ 5 clients' namespaces (the x-mq-namespace header, each Resource's resource_namespace): a request's
Resources are named within the namespace (model.in_namespace) before rocket reads them, and an answer's are seen from
within it again, the namespace in their resource_namespace, as apache's proxy answers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rocket.errors import RocketError
from rocket.model import check_namespace, in_namespace, outside_namespace
from rocket.transport.grpc_wire import GrpcError, GrpcStatus


def into_namespace(message: Any, namespace: str) -> None:
    """Name each Resource of a request within its resource_namespace, else within namespace (the header's); a
    namespace that is not a plain name ends the call with INVALID_ARGUMENT, naming it."""
    for resource in resources(message):
        try:
            within = check_namespace(resource.resource_namespace or namespace)
        except RocketError as error:
            raise GrpcError(GrpcStatus.INVALID_ARGUMENT, error.message) from None
        if within:
            resource.name = in_namespace(within, resource.name)
            resource.resource_namespace = ""


def out_of_namespace(message: Any, namespace: str) -> None:
    """Each Resource of an answer that lies in namespace, as the client named it; and its status's message, whose
    names are seen from within the namespace too."""
    for resource in resources(message):
        seen = outside_namespace(namespace, resource.name)
        if seen is not None:
            resource.name, resource.resource_namespace = seen, namespace
    has_status = "status" in message.DESCRIPTOR.fields_by_name and message.HasField("status")
    status = message.status if has_status else None
    if status is not None and f"{namespace}%" in status.message:
        status.message = status.message.replace(f"{namespace}%", "")


def resources(message: Any) -> Iterator[Any]:
    """Every Resource set in message, at any depth (in repeated fields and map values too)."""
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:  # (the descriptor's constants: no import of protobuf here)
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].type != field.TYPE_MESSAGE:
                continue
            items = list(value.values())
        else:  # one message, or a repeated field of them
            items = [value] if hasattr(value, "ListFields") else list(value)
        for item in items:
            if item.DESCRIPTOR.name == "Resource":
                yield item
            else:
                yield from resources(item)
