"""On-disk formats of the Raft WAL (and of the store's own log that earlier builds kept): the checksummed commit log
and its file helpers.

commitlog.py is the segment log that the WAL is made of; record.py is its record format (pure),
and direct.py the memory of an O_DIRECT log. An append refused for space cuts the file, and a direct log's memory,
back to the last whole record, so a retry follows it. files.py holds fsync_directory, replace_durably (a small file
written whole or not at all), free_bytes, and out_of_space (ENOSPC, EDQUOT).
"""
