"""The HTTP/1.1 route table (rocket/transport/http1.py): exact paths called with nothing, prefixes ending in "*"
called with the decoded path, the query's fields and the request's headers and source; exact before prefix, the
longest prefix first; a route's extra headers sent with its answer."""

import h11
import trio

from rocket.transport.http1 import Asked, _route, serve_http1
from rocket.transport.lifecycle import Lifecycle


def request(target: bytes, method: bytes = b"GET") -> h11.Request:
    return h11.Request(method=method, target=target, headers=[("host", "x")])


def routes(calls: list):
    async def exact():
        calls.append(("exact",))
        return 200, "text/plain", b"exact"

    def prefix(name):
        async def route(path, query, asked):
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


async def test_a_prefix_route_gets_the_headers_in_lower_case_and_the_source():
    seen = []

    async def route(path, query, asked):
        seen.append(asked)
        return 200, "text/plain", b"ok"

    request = h11.Request(method=b"GET", target=b"/x", headers=[("Host", "x"), ("Authorization", "Basic YTpi"),
                                                                 ("X-Twice", "1"), ("X-Twice", "2")])
    await _route(request, {"/*": route}, "10.0.0.7")
    assert seen == [Asked({"host": "x", "authorization": "Basic YTpi", "x-twice": "1"}, "10.0.0.7")]


async def test_over_a_socket_a_route_sees_its_client_and_its_extra_headers_are_sent():
    seen = []

    async def route(path, query, asked):
        seen.append(asked)
        if "authorization" not in asked.headers:
            return 401, "text/plain", b"sign in\n", [("www-authenticate", 'Basic realm="rocket"')]
        return 200, "text/plain", b"in\n"

    lifecycle = Lifecycle()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_http1, lifecycle, "127.0.0.1", 0, {"/*": route})
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while b"sign in" not in answer:
            answer += await stream.receive_some(4096)
        assert answer.startswith(b"HTTP/1.1 401 ") and b'www-authenticate: Basic realm="rocket"\r\n' in answer
        await stream.send_all(b"GET /a HTTP/1.1\r\nhost: x\r\nauthorization: Basic YTpi\r\n\r\n")
        answer = b""
        while b"in\n" not in answer:
            answer += await stream.receive_some(4096)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"www-authenticate" not in answer
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert [asked.source for asked in seen] == ["127.0.0.1", "127.0.0.1"]
