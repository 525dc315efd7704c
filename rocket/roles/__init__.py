"""The roles a node may run: nameserver/ (the cluster metadata), storage/ (the storage groups), broker/ (stateless,
facing the clients), controller/ (RIP-44's standalone controller). node.py makes and wires them (build_roles); peers.py
carries their calls to each other. Roles read time only from the Clock they are given (rocket/clock.py).
"""

__all__ = ["broker", "controller", "nameserver", "peers", "storage"]
