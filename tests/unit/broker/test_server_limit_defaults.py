"""`reliable broker start` without options runs on the configuration objects' defaults:
the command line takes every default from `ServerConfig`, `BrokerConfig`, `StoreConfig` and
`HaConfig` and keeps no copy of its own that could drift from them."""

from __future__ import annotations

from pathlib import Path

from broker.config import BrokerConfig
from broker.ha.config import HaConfig
from broker.server.config import ServerConfig
from broker.store.config import StoreConfig
from reliable_cli import build_parser
from reliable_cli.broker import plan_start


def test_a_broker_started_without_options_is_configured_as_the_defaults(tmp_path: Path) -> None:
    args = build_parser("broker").parse_args(["broker", "start", "--store", str(tmp_path)])
    plan = plan_start(args)
    assert plan.server_config == ServerConfig()
    assert BrokerConfig(**plan.broker_kwargs) == BrokerConfig()
    assert StoreConfig(**plan.store_kwargs) == StoreConfig(store_dir=tmp_path)
    assert plan.ha_config == HaConfig()


def test_an_option_given_reaches_its_config(tmp_path: Path) -> None:
    args = build_parser("broker").parse_args(
        ["broker", "start", "--store", str(tmp_path), "--max-body-size", "1024", "--queues", "8"]
    )
    plan = plan_start(args)
    assert plan.server_config.max_body_size == 1024
    assert BrokerConfig(**plan.broker_kwargs).max_message_size == 1024
    assert BrokerConfig(**plan.broker_kwargs).default_queue_nums == 8
    assert StoreConfig(**plan.store_kwargs).max_message_size < StoreConfig().max_message_size
