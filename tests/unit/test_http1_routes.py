"""The HTTP/1.1 route table (rocket/transport/http1.py): exact paths called with nothing, prefixes ending in "*"
called with the decoded path and the query's fields; exact before prefix, the longest prefix first."""

import h11

from rocket.transport.http1 import _route


def request(target: bytes, method: bytes = b"GET") -> h11.Request:
    return h11.Request(method=method, target=target, headers=[("host", "x")])


def routes(calls: list):
    async def exact():
        calls.append(("exact",))
        return 200, "text/plain", b"exact"

    def prefix(name):
        async def route(path, query):
            calls.append((name, path, query))
            return 200, "text/plain", name.encode()
        return route

    return {"/metrics": exact, "/*": prefix("root"), "/topics/*": prefix("topics")}


async def test_an_exact_path_is_called_without_arguments_even_with_a_query():
    calls = []
    assert await _route(request(b"/metrics?x=1"), routes(calls)) == (200, "text/plain", b"exact")
    assert calls == [("exact",)]


async def test_the_longest_prefix_gets_the_decoded_path_and_the_first_value_of_each_field():
    calls = []
    status, _, body = await _route(request(b"/topics/a%3Cb%3E?key=k%20%26&key=second&from="), routes(calls))
    assert (status, body) == (200, b"topics")
    assert calls == [("topics", "/topics/a<b>", {"key": "k &", "from": ""})]
    await _route(request(b"/groups"), routes(calls))
    assert calls[-1] == ("root", "/groups", {})


async def test_no_route_is_404_and_other_methods_405():
    calls = []
    only_exact = {"/metrics": routes(calls)["/metrics"]}
    status, _, body = await _route(request(b"/nothing?q=1"), only_exact)
    assert status == 404 and body == b"no page /nothing\n"
    assert (await _route(request(b"/topics/x", b"POST"), routes(calls)))[0] == 405
    assert (await _route(request(b"/metrics", b"DELETE"), routes(calls)))[0] == 405
    assert calls == []


async def test_undecodable_bytes_in_the_path_and_query_are_replaced_not_raised():
    calls = []
    status, _, _ = await _route(request(b"/topics/%ff?key=%fe"), routes(calls))
    assert status == 200 and calls == [("topics", "/topics/\ufffd", {"key": "\ufffd"})]
