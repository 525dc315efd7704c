"""What a handler's failure answers: operating errors as they are, the first of a group of them (a handler's
concurrent parts), and anything else as INTERNAL."""

from __future__ import annotations

import pytest

from rocket.errors import Code, RocketError
from rocket.transport.rpc import Dispatcher


def failing(error: BaseException):
    async def handler(request: dict) -> dict:
        raise error
    return handler


async def test_a_group_of_operating_errors_answers_the_first_and_a_bug_among_them_is_internal():
    dispatcher = Dispatcher()
    not_leader = RocketError(Code.UNAVAILABLE, "not the leader; the leader is 1")
    dispatcher.handle("StorageReceipt", failing(ExceptionGroup("queues", [
        not_leader, ExceptionGroup("more", [RocketError(Code.UNAVAILABLE, "not the leader; the leader is 2")])])))
    with pytest.raises(RocketError) as caught:
        await dispatcher.local("StorageReceipt", {})
    assert caught.value is not_leader

    dispatcher.handle("StorageReceipt", failing(ExceptionGroup("queues", [not_leader, KeyError("queue")])))
    with pytest.raises(RocketError) as caught:
        await dispatcher.local("StorageReceipt", {})
    assert caught.value.code == Code.INTERNAL
