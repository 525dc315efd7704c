"""On-disk formats shared by the Raft WAL and the store: the checksummed commit log and its file helpers."""
