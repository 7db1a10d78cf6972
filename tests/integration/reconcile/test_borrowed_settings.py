"""A run's changes to a caller's Spark session are given back, whether the run failed or
not: settings it changed, settings it set that were unset, and the thread's job group."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.reconcile.session import borrowed_settings

pytestmark = pytest.mark.spark

UNSET_KEY = "spark.reliable.test.borrowed"  # no Spark setting: unset until the block sets it


def test_a_failed_block_gives_the_session_back_as_it_was(spark: Any) -> None:
    sc = spark.sparkContext
    shared = spark.conf.get("spark.sql.shuffle.partitions")  # the package's session
    try:
        _check_given_back(spark, sc)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shared)
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)


def _check_given_back(spark: Any, sc: Any) -> None:
    spark.conf.set("spark.sql.shuffle.partitions", "13")
    sc.setJobGroup("callers-group", "the caller's jobs")
    before_tz = spark.conf.get("spark.sql.session.timeZone")
    assert spark.conf.get(UNSET_KEY, None) is None

    class Boom(Exception):
        pass

    with pytest.raises(Boom), borrowed_settings(spark) as settings:
        settings.set("spark.sql.shuffle.partitions", "3")
        settings.set("spark.sql.shuffle.partitions", "4")  # the first previous value is kept
        settings.set("spark.sql.session.timeZone", "Asia/Tokyo")
        settings.set(UNSET_KEY, "yes")
        settings.job_group("run-1", "reliable reconcile")
        assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
        assert sc.getLocalProperty("spark.jobGroup.id") == "run-1"
        raise Boom

    assert spark.conf.get("spark.sql.shuffle.partitions") == "13"
    assert spark.conf.get("spark.sql.session.timeZone") == before_tz
    assert spark.conf.get(UNSET_KEY, None) is None
    assert sc.getLocalProperty("spark.jobGroup.id") == "callers-group"
    assert sc.getLocalProperty("spark.job.description") == "the caller's jobs"
