"""The rocket client SDK: connect(), Admin, Producer, TransactionProducer, Consumer (pull), SimpleConsumer and
PushConsumer (pop); KV is in kv.py. Everything here takes any Channel, so it is unit-tested over MockChannel and
LocalChannel.
"""

from rocket.client.admin import Admin
from rocket.client.connection import connect
from rocket.client.consumer import Consumer, open_consumer, parse_start
from rocket.client.producer import Producer, Receipt, open_producer
from rocket.client.simple import PushConsumer, SimpleConsumer
from rocket.client.transaction import Outcome, Transaction, TransactionProducer, open_transaction_producer

__all__ = ["Admin", "Consumer", "Outcome", "Producer", "PushConsumer", "Receipt", "SimpleConsumer", "Transaction",
           "TransactionProducer", "connect", "open_consumer", "open_producer", "open_transaction_producer",
           "parse_start", "admin", "bench", "connection", "kv", "namespaced"]
