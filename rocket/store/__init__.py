"""The storage state machine (machine.py, pure) and its shell (store.py, on LevelDB) for every storage group a node
hosts. A group's Raft log is its commit log and the WAL the only log: Store says how a power cut is survived, and
StorageMachine how to add a kind of replicated state."""

__all__ = ["commands", "kv", "meter", "store", "values"]
