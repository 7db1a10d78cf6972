"""The official Python client's tests, run unchanged through the gateway (conftest.py):
those written against the module's `server` (the others start servers of their own)."""

from __future__ import annotations

from tests.e2e.grpc.test_body_digest import (  # noqa: F401
    test_a_fifo_push_consumer_gets_every_body_in_order_and_dead_letters_none,
    test_a_push_consumer_listener_gets_every_body,
    test_a_simple_consumer_receives_every_body_unflagged,
)
from tests.e2e.grpc.test_push import (  # noqa: F401
    test_fifo_poison_message_is_forwarded_to_dlq_and_the_group_moves_on,
    test_fifo_push_consumer_keeps_group_order_under_failures,
    test_fifo_simple_consumer_holds_the_group_while_in_flight,
    test_push_consumer_retries_failures_and_loses_nothing,
    test_two_push_consumers_and_three_producers_share_the_work,
)
from tests.e2e.grpc.test_simple import (  # noqa: F401
    test_change_invisible_duration_returns_new_handle,
    test_change_invisible_duration_to_zero_makes_it_visible_now,
    test_dead_letter_after_max_attempts,
    test_redelivery_after_invisible_time_increments_attempt,
    test_tags_keys_properties_survive_and_tags_filter,
    test_thousand_messages_no_loss_no_duplicates,
)
from tests.e2e.grpc.test_transactions import (  # noqa: F401
    test_delay_beyond_one_day_is_refused,
    test_delay_message_arrives_at_its_time,
    test_half_message_invisible_until_commit,
    test_orphaned_transaction_is_checked_over_telemetry,
    test_recall_withdraws_a_delay_message,
)
