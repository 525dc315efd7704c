"""The asyncio loop the remote stores' clients run on (rocket.tier.retries.asyncio_loop): an error an asyncio library
reports from a task of its own that nobody awaits is logged, never raised into the node (it killed one, issue 54)."""

from __future__ import annotations

import asyncio
import gc
import logging
import traceback

import pytest
import trio
import trio_asyncio

from rocket.tier.retries import asyncio_loop


async def leave_a_failed_task_behind(loop) -> None:
    """What aiohttp does when the store resets a connection mid-request: its task writing the body fails, and no one
    retrieves the error; asyncio reports it to the loop's exception handler once the task is collected."""
    async def write_bytes() -> None:
        raise ConnectionResetError("Cannot write to closing transport")

    async def request() -> None:
        task = asyncio.ensure_future(write_bytes())
        await asyncio.sleep(0.01)
        assert task.done()
        del task
        gc.collect()

    await trio_asyncio.aio_as_trio(request, loop=loop)()
    await trio.sleep(0.01)


async def test_a_background_error_of_the_client_is_logged_and_the_loop_lives_on(caplog):
    caplog.set_level(logging.WARNING, logger="rocket.tier")
    async with asyncio_loop() as loop:
        await leave_a_failed_task_behind(loop)
        assert await trio_asyncio.aio_as_trio(asyncio.sleep, loop=loop)(0, "still running") == "still running"
    assert "in the background" in caplog.text and "Cannot write to closing transport" in caplog.text


async def test_the_callers_loop_is_used_and_gets_the_same_handler(caplog):
    caplog.set_level(logging.WARNING, logger="rocket.tier")
    async with trio_asyncio.open_loop() as outer:
        async with asyncio_loop() as loop:
            assert loop is outer
        await leave_a_failed_task_behind(outer)
    assert "Cannot write to closing transport" in caplog.text


async def test_without_it_trio_asyncio_raises_the_error_into_trio():
    """Why the handler exists: trio-asyncio's own default raises it into the loop's nursery."""
    with pytest.raises(BaseException) as caught:
        async with trio_asyncio.open_loop() as loop:
            await leave_a_failed_task_behind(loop)
            await trio.sleep(0.05)
    assert "Cannot write to closing transport" in "".join(traceback.format_exception(caught.value))
