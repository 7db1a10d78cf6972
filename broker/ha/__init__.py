"""Master/slave replication of the commitlog (RocketMQ's HA service; docs/ha.md).

Off unless a role is configured: a master (`HaMaster`) listens on its HA port and streams
its commitlog to every slave that connects; a slave (`HaSlave`) reports where its own
commitlog ends, writes what it receives byte for byte at the same offsets
(`MessageStore.append_replica`), and reports back how far it has it.
"""

from broker.ha.config import HaConfig, HaRole
from broker.ha.master import AckOutcome, HaMaster, SlaveState
from broker.ha.protocol import HaProtocolError
from broker.ha.slave import HaSlave

__all__ = [
    "AckOutcome",
    "HaConfig",
    "HaMaster",
    "HaProtocolError",
    "HaRole",
    "HaSlave",
    "SlaveState",
]
