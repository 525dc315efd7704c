"""The properties in which both RocketMQ gateways (gRPC and remoting) keep what rocket's message has no field for,
so that a message sent over one is read alike over the other. The keys and the client's message id are in
rocket.model (KEYS_PROPERTY, ID_PROPERTY): the stores' key index reads them too."""

BORN_HOST_PROPERTY = "__rmq.born_host"  # the producer's address
