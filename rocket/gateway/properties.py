"""The properties in which both RocketMQ gateways (gRPC and remoting) keep what rocket's message has no field for,
so that a message sent over one is read alike over the other."""

KEYS_PROPERTY = "__rmq.keys"  # a message's RocketMQ keys, space-separated, when rocket's one key cannot hold them
ID_PROPERTY = "__rmq.id"  # the message id the client gave (gRPC's message_id, remoting's UNIQ_KEY)
BORN_HOST_PROPERTY = "__rmq.born_host"  # the producer's address
