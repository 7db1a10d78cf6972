"""Screenshots of every console page, taken against a real demo workload.

    .venv/bin/python scripts/console_screenshots.py [--out docs/console] [--orders 200]

Starts a broker process, starts the console on it (sampling every 2 s, actions on), runs
`reliable demo --endpoint` against the broker (orders through the outbox, failures and
retries, poison messages dead-lettered, lost sends resent), leaves a second group lagging
behind 800 payments and lets a slow consumer work its lag off while the charts sample,
runs the Spark reconciliation with a report table, then opens each page in headless
Chromium and saves `<out>/<page>.png`. Needs Redis, Java, chromium and chromium-driver
(scripts/ensure-system.sh). Takes two to three minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reliable import (  # noqa: E402
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    connect,
)
from reliable.admin import AdminClient  # noqa: E402
from tests.e2e.console.harness import (  # noqa: E402
    PASSWORD,
    ConsoleProcess,
    chrome,
    login,
    save,
    wait_for,
)
from tests.e2e.grpc.conftest import FAST  # noqa: E402
from tests.e2e.grpc.server_process import ServerProcess  # noqa: E402


def log(text: str) -> None:
    print(f"[screenshots] {text}", file=sys.stderr, flush=True)


def run_cli(*args: str, ok: Sequence[int] = (0,)) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "reliable_cli", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=900,
    )
    if done.returncode not in ok:
        raise SystemExit(
            f"reliable {' '.join(args[:2])} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done


def lagging_group(endpoint: str, count: int) -> threading.Thread:
    """800 payments behind a group whose slow consumer starts after a few samples."""
    topic, group = "PaymentCaptured", "settlement"
    admin = AdminClient(endpoint)
    admin.call("CreateTopic", name=topic, queues=4)
    admin.call("CreateGroup", name=group)
    t = connect("grpc", endpoint=endpoint)
    t.start()
    with Producer(t) as producer:
        for i in range(count):
            producer.send(
                Message(topic, f'{{"payment": {i}}}'.encode(), keys=[f"P-{i:06d}"], tags="captured")
            )
    admin.call("SetGroupStart", group=group, topic=topic, consume_from="FIRST")
    admin.close()

    def slow(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        time.sleep(0.04 * len(messages))
        return ConsumeResult.SUCCESS

    def work() -> None:
        time.sleep(8)  # a flat stretch on the chart first
        consumer = PushConsumer(
            group,
            slow,
            {topic: "*"},
            transport=t,
            consume_from=ConsumeFrom.FIRST,
            consume_threads=1,
            heartbeat_interval_s=1.0,
            receive_long_poll_ms=1000,
        )
        with consumer:
            admin = AdminClient(endpoint)
            try:
                wait_for(
                    lambda: admin.call("GroupProgress", group=group)["total"]["lag"] == 0, 300, 1.0
                )
            finally:
                admin.close()
        t.close()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    return worker


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "console")
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--payments", type=int, default=800)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="console-shots-") as tmp:
        work = Path(tmp)
        db = f"sqlite:///{work / 'shop.db'}"
        password = work / "console.pw"
        password.write_text(PASSWORD + "\n")
        broker = ServerProcess(work / "store", work, *FAST).start()
        log(f"broker on {broker.endpoint}")
        console = ConsoleProcess(
            broker.endpoint,
            "--db",
            db,
            "--prefix",
            "demo_",
            "--report-table",
            "demo_reconcile_report",
            "--allow-actions",
            password_file=password,
        )
        console.extra = (*console.extra, "--sample-interval", "2")
        console.start()
        log(f"console on {console.url}")
        try:
            log(f"demo: {args.orders} orders through the outbox")
            run_cli(
                "demo",
                "--endpoint",
                broker.endpoint,
                "--db",
                db,
                "--orders",
                str(args.orders),
                "--seed",
                "42",
                "--no-reconcile",
                ok=(0, 3),
            )
            log(f"{args.payments} payments behind group settlement")
            worker = lagging_group(broker.endpoint, args.payments)
            log("reconciliation (Spark) with a report table")
            run_cli(
                "reconcile",
                "--db",
                db,
                "--prefix",
                "demo_",
                "--report-table",
                "demo_reconcile_report",
                "--conf",
                "spark.ui.enabled=false",
                ok=(0, 3),
            )
            worker.join(300)
            time.sleep(4)
            shoot(console.url, broker.endpoint, args.out)
        finally:
            console.stop()
            broker.terminate()
    log(f"saved under {args.out}")
    return 0


def shoot(url: str, endpoint: str, out: Path) -> None:
    from selenium.webdriver.common.by import By

    admin = AdminClient(endpoint)
    dead = admin.call("ListDeadLetters", group="inventory")["messages"]
    order = admin.call("QueryMessage", topic="OrderCreated", since_ms=0, limit=1)["messages"]
    admin.close()
    with chrome(width=1360, height=900) as driver:
        driver.get(url + "login")
        save(driver, out, "login")
        login(driver, url, user="oncall")
        driver.get(url)
        save(driver, out, "overview")
        driver.get(url + "topics/PaymentCaptured")
        save(driver, out, "topic")
        driver.get(url + "groups/settlement")
        save(driver, out, "group")
        if order:
            key = order[0]["keys"][0]
            driver.get(url + f"messages?by=key&value={key}&topic=OrderCreated")
            save(driver, out, "messages")
        if dead:
            driver.get(url + f"trace?key={dead[0]['msg_id']}")
            save(driver, out, "trace")
            driver.get(url + "dlq/inventory")
            save(driver, out, "dlq")
            driver.find_elements(By.CSS_SELECTOR, "input.pick")[0].click()
            driver.find_element(By.ID, "review-button").click()
            save(driver, out, "dlq-confirm")
            driver.find_element(By.ID, "confirm-button").click()
            wait_for(
                lambda: (driver.refresh(), driver.find_element(By.ID, "job-state").text == "done")[
                    1
                ],
                30,
            )
            save(driver, out, "dlq-replay-job")
        driver.get(url + "outbox")
        save(driver, out, "outbox")
        driver.get(url + "reconcile")
        save(driver, out, "reconcile")


if __name__ == "__main__":
    sys.exit(main())
