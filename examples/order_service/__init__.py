"""An order service that publishes `OrderCreated` through the outbox, and an inventory
consumer that reserves stock idempotently. Run it: `python -m examples.order_service`."""
