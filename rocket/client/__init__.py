"""The rocket client SDK: connect(), Admin, Producer, TransactionProducer, Consumer (pull), SimpleConsumer and
PushConsumer (pop); KV is in kv.py.

connect() (connection.py) gives a FailoverChannel over the TCP client, or an HTTP/2 channel. The producer is
idempotent: its Sequencer holds a random producer id and puts a sequence on every batch it sends. credentials.py finds
a client's user and secret; each connection's first call signs in with them. throttle.py waits out the `throttle_ms`
a broker's answer gives. Everything here takes any Channel, so it is unit-tested over MockChannel and LocalChannel.
"""

from rocket.client.admin import Admin
from rocket.client.connection import connect
from rocket.client.consumer import Consumer, open_consumer, parse_start
from rocket.client.producer import Producer, Receipt, open_producer
from rocket.client.simple import PushConsumer, SimpleConsumer
from rocket.client.transaction import Outcome, Transaction, TransactionProducer, open_transaction_producer

__all__ = ["Admin", "Consumer", "Outcome", "Producer", "PushConsumer", "Receipt", "SimpleConsumer", "Transaction",
           "TransactionProducer", "connect", "open_consumer", "open_producer", "open_transaction_producer", "parse_start"]
