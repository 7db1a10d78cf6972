"""`StoreStatus {}`: how full the store's disk is against its watermarks, and how much
commitlog it holds (what the console's overview shows beside lag and dead letters)."""

from __future__ import annotations

from broker.broker import Broker
from protocol.admin import Params


def store_status(broker: Broker, params: Params) -> dict[str, object]:
    store = broker.store
    cfg = store.config
    low, high = store.get_commitlog_min_offset(), store.get_commitlog_max_offset()
    return {
        "store_dir": str(cfg.store_dir),
        "disk_used_ratio": round(store.cleanup.measure_disk(), 4),
        "disk_full": store.is_disk_full(),
        "watermarks": {
            "cleanup_from": cfg.disk_max_used_space_ratio,
            "clean_forcibly": cfg.disk_clean_watermark,
            "refuse_writes": cfg.disk_refuse_watermark,
        },
        "commitlog_min_offset": low,
        "commitlog_max_offset": high,
        "commitlog_bytes": high - low,
    }
