"""The end-to-end order flow that `reliable demo` runs.

An order service publishes `OrderCreated` through the outbox inside its transactions; two
inventory consumers in one group reserve stock idempotently; some deliveries fail and are
retried through the delay levels; poison messages end in `%DLQ%inventory`; some sends are
lost after the broker "acknowledged" them and the resend worker recovers them; finally the
Spark reconciliation certifies that nothing is unaccounted for.

    from reliable_cli.demo import DemoOptions, run_demo
    summary = run_demo(DemoOptions(orders=100, seed=7))
"""

from reliable_cli.demo.faults import ChaoticSender, FaultPlan, FaultRates, OrderFate
from reliable_cli.demo.flow import DEMO_DELAY_LEVELS, DemoFailed, DemoOptions, run_demo
from reliable_cli.demo.shop import GROUP, TOPIC, Inventory, Shop
from reliable_cli.demo.tally import Summary

__all__ = [  # noqa: RUF022 - grouped by purpose
    # running it
    "DemoOptions",
    "DemoFailed",
    "Summary",
    "run_demo",
    "DEMO_DELAY_LEVELS",
    # its parts
    "ChaoticSender",
    "FaultPlan",
    "FaultRates",
    "OrderFate",
    "Inventory",
    "Shop",
    "GROUP",
    "TOPIC",
]
