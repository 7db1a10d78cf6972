"""The broker's storage engine: commitlog, consume queues, hash index, recovery, cleanup."""
