"""How calls travel: between clients and nodes, and between nodes.

channel.py is the one Channel interface (call, stream) that every channel implements; local.py has the ones that
never leave the process. rpc.py is the dispatcher: every method is defined once (METHODS), and the transports only
move bytes. The dispatcher gives each connection its Caller. With auth on, every call from the wire is checked
against rocket/access.py. On brokers, every client call is charged to the client quotas of rocket/quotas.py after it
is served: its answer's `throttle_ms` is set, and the connection's next call is held while it is throttled.

The data plane. A method may have a parked handler besides its task handler (Dispatcher.handle(..., parked=)): Produce,
KvPut and KvGet on brokers, StorageAppend, StorageKvTxn and StorageKvRead on storage nodes. Over TCP such a call takes
no task: Dispatcher.park decodes and authorizes it as call() does and the handler parks it (rocket/parked.py); the Raft
round that applies its entry (or, for a get, the leader's lease) completes it, and the connection's writer sends that
round's answers in one write. A throttled caller, or a call the handler cannot serve without waiting (Unparked: no
cached route, no open channel to the leader), is a task as before. A call served by a task ends the same way: its answer
goes to the connection's writer, which sends the answers of the calls that ended meanwhile in one write (a connection's
only open call sends its own). Either way a call holds its in-flight slot until its answer is written, so a client that
stops reading stops the server reading it. TcpChannel.call_parked is the client side: a call that waits as a slot, its
request written by the channel's writer with the others queued meanwhile, for a broker's produce forwarded to another
node's leader.

The listeners. TCP: tcp.py is the server, tcp_client.py the client (TcpChannel), streams.py the byte movers both
share, frames.py the codec (a server's decoder holds the bytes that arrived, never the length a header claims).
Remoting's connections share the TCP port and its limits. HTTP/2 on h2: h2_endpoint.py, h2_server.py and h2_client.py, with grpc_wire.py for gRPC. The
HTTP/2 server gives receive windows back as handlers take the bytes, so partly received bodies are bounded per
connection and per node (limits.http2_*held_bytes_max; past the node's bound, the biggest holder's fullest stream is
reset). It closes connections idle `http2_idle_s`, resets bodies not complete within `http2_request_s`, and one
stream's h2 error ends that stream only. HTTP/1.1 on h11: http1.py serves the node's /metrics, /healthz, /readyz and
the web console.

Between nodes. links.py carries Raft messages: each payload is a RaftStep post (a POST frame, never answered) from
the link's one task, served in the peer's read loop; a link whose posts the peer's host leaves unacknowledged
limits.raft_link_silent_s is broken by the kernel (TCP_USER_TIMEOUT, listen.connect) and connected again.
pool.py holds the channels to other nodes, peer_auth.py admits them (PeerHello), and tls.py
builds every SSL context. listen.py accepts and opens connections. background.py is the nursery of tasks that
outlive their call; links, the pool and the broker hold one.

Schema versions (issue 34). A TCP client's first call is Hello (open_tcp_channel, before PeerHello): its schema
version, answered with the server's. A server too old to know Hello answers UNKNOWN_METHOD: version 1. The server
takes a connection that said nothing for version 1. Node-to-node connections (pool.py, links.py) are TCP channels,
so they say it too. Over HTTP/2 the client asks Hello before its first call, and each request's `rocket-schema`
header says the version its body is in and its answer is wanted in (absent: 1). The dispatcher answers Hello; the
TCP and HTTP/2 transports then read and write each connection's messages in the older of the two versions, with the
codecs of rocket/serde/versions.py.

To add a client RPC method: define it once in the dispatcher's method table, write its handler in the broker module
of its concern, and add its Avro schemas under rocket/serde/schemas/. It is then served over TCP and HTTP/2 alike.
"""
