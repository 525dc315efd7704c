"""Protocol adapters onto the dispatcher: they translate other protocols and carry no semantics of their own.

rocketmq/ serves Apache RocketMQ 5's gRPC API on the HTTP/2 listener, remoting/ RocketMQ's classic remoting
protocol on the TCP port, and console/ the web console on the HTTP/1.1 listener. Both RocketMQ gateways share
properties.py (where a message keeps what rocket's has no field for: the client's message id, several keys, the
producer's address) and reads.py.
"""
