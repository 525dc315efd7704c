"""Limits of the wire: frames, connections, TLS, HTTP/2, gRPC, HTTP/1.1 and TCP timeouts."""

from rocket.errors import invariant
from rocket.limits.data import batch_bytes_max
from rocket.limits.units import KiB, MiB

frame_bytes_max = batch_bytes_max * 4 // 3 + 64 * KiB  # one batch plus envelope, even base64-encoded in JSON
method_name_bytes_max = 128  # method names are short identifiers
in_flight_requests_per_connection_max = 256  # pipelining depth before the reader stops reading
connections_max = 4096  # open client connections per listener; file descriptors are finite
# A TLS client that has not finished its handshake by then is dropped: a slow or silent one holds a connection slot
# (limits.connections_max), and a handshake takes a few round trips, milliseconds even across regions.
tls_handshake_s_max = 10.0
stream_items_queued_max = 8  # server-stream items waiting for the socket before the producer blocks
http2_streams_per_connection_max = 128  # concurrent HTTP/2 streams per connection (SETTINGS)
tcp_receive_bytes = 256 * KiB  # one read from a TCP connection: many small frames; a large one goes to its own buffer
tcp_send_buffers_max = 64  # buffers per sendmsg, well under IOV_MAX (1024)
frame_joined_bytes_max = 4 * KiB  # a frame with a body this small (no attachment) is encoded into one buffer
frame_shared_buffer_bytes_max = 64 * KiB  # larger frames are received into their own buffer: one copy, no memmove
# A server's large frame gets a buffer this many times what arrived, grown by this factor as it fills (frames.py):
# a claimed length costs nothing until its bytes come, and the copies as it grows add at most 1/(factor - 1) of it.
frame_buffer_growth = 4
# ... or the whole frame, when that is at most this much more: a 1 MiB batch's frame (a few dozen bytes over 1 MiB),
# begun with a read of tcp_receive_bytes, gets one buffer, not a second one and a copy
frame_buffer_slack_bytes = 64 * KiB
frame_spare_buffers_max = 3  # a reusing decoder's buffers: a response being decoded, one pulled ahead, one arriving
http2_receive_bytes = 1 * MiB  # one read from an HTTP/2 connection: a whole DATA frame of ours at a time
# HTTP/2 receive windows. The server gives a stream's window back as its body arrives, up to the body's bound, and
# the connection's only while the connection holds less than http2_connection_held_bytes_max of partly received
# bodies (past it, only its fullest stream gets window, so that one completes and frees its bytes).
http2_stream_window_bytes = 1 * MiB  # a stream's initial window: 64 KiB stalls bulk produce; bigger lets each stream hold more
http2_connection_window_bytes = 8 * http2_stream_window_bytes  # what a client may send on a connection before it hears back
# Partly received request bodies and unread gRPC input one HTTP/2 connection makes the server hold, bytes, before the
# server stops giving it connection window for any but its fullest stream. A connection then holds at most this, plus
# its connection window, plus one body, plus what its other streams' windows still allow (at most a stream window each).
http2_connection_held_bytes_max = 16 * MiB
# The same over all HTTP/2 connections of a node, bytes: past it the connection holding most has its fullest stream
# reset (ENHANCE_YOUR_CALM), until the node holds less. Many hostile connections cannot grow the node past it.
http2_held_bytes_max = 256 * MiB
http2_idle_s_default = 120.0  # an HTTP/2 connection with no open stream this long gets GOAWAY and is closed (slowloris)
# A request body (or one gRPC message) not complete this long after it began gets RST_STREAM (CANCEL): a slow or
# stalled sender holds its bytes no longer. gRPC streams between messages (telemetry, long polls) are not timed.
http2_request_s_default = 60.0
http2_watch_s_max = 1.0  # an HTTP/2 connection looks at its timeouts at least this often: they are that precise
http2_frame_bytes_max = 1 * MiB  # our SETTINGS_MAX_FRAME_SIZE: fewer, larger DATA frames, less per-frame Python work
http2_goodbye_timeout_s = 1.0  # a closing connection waits this long to deliver GOAWAY to a peer that may not read
header_text_chars_max = 1024  # grpc-message and rocket-message: proxies and clients drop very long header values
grpc_message_bytes_max = frame_bytes_max  # one gRPC message, either way: the RPC body bound
grpc_buffered_bytes_max = 2 * grpc_message_bytes_max  # a gRPC stream's unread input, so a peer cannot fill memory
grpc_timeout_s_max = 24 * 3600.0  # a longer grpc-timeout is treated as none worth tracking
http1_header_bytes_max = 16 * KiB  # an HTTP/1.1 request's line and headers; longer ones get 431
http1_body_bytes_max = 64 * KiB  # an HTTP/1.1 request's body (the pages served take none); more gets 413
http1_idle_s = 60.0  # an HTTP/1.1 connection with no request for this long is closed (scrapers keep theirs alive)
tcp_sniff_bytes = 6  # a connection's first bytes that tell rocket's frames from remoting's (gateway/remoting/codec.py)
tcp_sniff_s_max = 60.0  # a connection that sends fewer bytes than that for this long is closed
# A request frame's first byte to its last, counting only the server's waiting (tcp_frame_s): a slow-sending peer
# (slowloris) holds a connection and a frame's buffer. The largest frame (frame_bytes_max) needs 1.5 Mbit/s for 60 s.
tcp_frame_s_default = 60.0
# A TCP connection with no call in flight (a long poll and a stream are calls) this long is closed (tcp_idle_s): its
# slot (connections_max) and socket go back. Pools and failover channels reconnect on their next call.
tcp_idle_s_default = 900.0
# Frames not yet whole, held by all a listener's TCP connections together (FrameDecoder.held_bytes); past it the
# connection holding the most is closed (OVERLOADED). 24 of the largest frames arriving at once fit.
tcp_partial_frames_bytes_max = 256 * MiB

invariant(16 * KiB <= http2_frame_bytes_max < 16 * MiB, "RFC 9113 allows SETTINGS_MAX_FRAME_SIZE from 2^14 to 2^24 - 1")
invariant(http2_frame_bytes_max <= http2_stream_window_bytes <= http2_connection_window_bytes < 2**31,
          "a full DATA frame fits a stream's window, a stream's window the connection's, both under RFC 9113's 2^31 - 1")
invariant(http2_connection_window_bytes >= 65_535, "the connection window is only raised from RFC 9113's initial 65,535")
invariant(http2_stream_window_bytes <= frame_bytes_max <= http2_connection_held_bytes_max,
          "a body larger than a stream's window completes as its window is given back, and one body fits a connection's hold")
invariant(http2_connection_held_bytes_max + http2_connection_window_bytes + frame_bytes_max
          + http2_streams_per_connection_max * http2_stream_window_bytes <= http2_held_bytes_max,
          "one connection at its worst stays under the node's bound: only many connections reach it")
invariant(http2_watch_s_max <= http2_request_s_default, "timeouts are looked at well within their length")
invariant(grpc_message_bytes_max + 5 + http2_stream_window_bytes <= grpc_buffered_bytes_max,
          "a gRPC stream's unread input holds a whole message and the window a client may still send past it")
invariant(tcp_partial_frames_bytes_max >= 16 * frame_bytes_max and tcp_partial_frames_bytes_max >= 64 * tcp_receive_bytes,
          "many producers' largest frames arrive at once without one being closed")
