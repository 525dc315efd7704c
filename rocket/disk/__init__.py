"""On-disk formats of the Raft WAL (and of the store's own log that earlier builds kept): the checksummed commit log
(commitlog.py), its record format (record.py), a direct log's memory (direct.py), file helpers (files.py), and the
peers' schema versions a node keeps (peer_versions.py)."""

__all__ = ["commitlog", "files", "peer_versions", "record"]
