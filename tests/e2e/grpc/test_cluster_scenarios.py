"""The official-client scenarios of `test_simple`, `test_push` and `test_transactions`,
unchanged, against a cluster of two broker groups (a master and a slave each) instead of
one server (docs/ha.md, Broker groups).

Each scenario gets the cluster's access point, every master separated by ';' (the form the
official client takes): its producers send round-robin over both groups' queues, its
consumers receive from both masters, `AdminClient` creates topics and groups in both, and a
recall handle names its group, so RecallMessage reaches the schedule that holds it.

Not run here: the two scenarios that restart their own single server
(`test_resent_message_id_is_stored_once_even_across_a_restart`,
`test_slow_handler_keeps_its_message_through_auto_renewal`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.grpc.cluster_process import Cluster
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.test_push import (
    test_fifo_poison_message_is_forwarded_to_dlq_and_the_group_moves_on,
    test_fifo_push_consumer_keeps_group_order_under_failures,
    test_fifo_simple_consumer_holds_the_group_while_in_flight,
    test_push_consumer_retries_failures_and_loses_nothing,
    test_two_push_consumers_and_three_producers_share_the_work,
)
from tests.e2e.grpc.test_simple import (
    test_change_invisible_duration_returns_new_handle,
    test_change_invisible_duration_to_zero_makes_it_visible_now,
    test_dead_letter_after_max_attempts,
    test_redelivery_after_invisible_time_increments_attempt,
    test_tags_keys_properties_survive_and_tags_filter,
    test_thousand_messages_no_loss_no_duplicates,
)
from tests.e2e.grpc.test_transactions import (
    test_delay_beyond_one_day_is_refused,
    test_delay_message_arrives_at_its_time,
    test_half_message_invisible_until_commit,
    test_orphaned_transaction_is_checked_over_telemetry,
    test_recall_withdraws_a_delay_message,
)

SCENARIOS = [
    test_thousand_messages_no_loss_no_duplicates,
    test_tags_keys_properties_survive_and_tags_filter,
    test_redelivery_after_invisible_time_increments_attempt,
    test_change_invisible_duration_returns_new_handle,
    test_dead_letter_after_max_attempts,
    test_change_invisible_duration_to_zero_makes_it_visible_now,
    test_push_consumer_retries_failures_and_loses_nothing,
    test_fifo_push_consumer_keeps_group_order_under_failures,
    test_fifo_simple_consumer_holds_the_group_while_in_flight,
    test_fifo_poison_message_is_forwarded_to_dlq_and_the_group_moves_on,
    test_two_push_consumers_and_three_producers_share_the_work,
    test_half_message_invisible_until_commit,
    test_orphaned_transaction_is_checked_over_telemetry,
    test_delay_message_arrives_at_its_time,
    test_delay_beyond_one_day_is_refused,
    test_recall_withdraws_a_delay_message,
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, client_home: Path) -> Iterator[Cluster]:
    """The scenarios' `server`: two broker groups; `.endpoint` names both masters."""
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), client_home, *FAST).start()
    yield cluster
    # both groups took the scenarios' messages (the bulk of them: 1000 and more)
    cluster.finish(min_offset=200_000)


def test_the_scenarios_are_the_single_server_ones() -> None:
    """Every scenario of those modules that runs on the module's one server is here."""
    import inspect

    from tests.e2e.grpc import test_push, test_simple, test_transactions

    on_one_server = {
        name
        for module in (test_simple, test_push, test_transactions)
        for name, fn in vars(module).items()
        if name.startswith("test_") and set(inspect.signature(fn).parameters) <= {"server", "seed"}
    }
    assert on_one_server == {fn.__name__ for fn in SCENARIOS}
