"""The web console in a real headless Chromium, against a real broker process.

An operator logs in, searches a message by key and opens its trace; watches a group's lag
fall on the overview (number and chart) while a consumer works; replays one dead letter
and sees the group consume it; and finds that a read-only console refuses actions and that
nothing is shown without logging in.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from reliable import (
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    Transport,
    connect,
)
from reliable.admin import AdminClient
from tests.e2e.console.harness import PASSWORD, ConsoleProcess, http, login, save, wait_for
from tests.e2e.grpc.server_process import ServerProcess

pytestmark = pytest.mark.slow


def by_id(driver: Any, element_id: str, timeout_s: float = 20.0) -> Any:
    """The element, once the page showing it has loaded: a click that submits a form
    returns before the next page is there on a busy machine."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s).until(lambda d: d.find_element(By.ID, element_id))


def grpc_transport(endpoint: str) -> Transport:
    t = connect("grpc", endpoint=endpoint)
    t.start()
    return t


def send(endpoint: str, messages: Sequence[Message]) -> list[str]:
    t = grpc_transport(endpoint)
    try:
        with Producer(t) as producer:
            return [producer.send(m).message_id for m in messages]
    finally:
        t.close()


def consumer(
    t: Transport,
    group: str,
    topic: str,
    listener: Callable[[Sequence[ReceivedMessage], ConsumeContext], ConsumeResult],
) -> PushConsumer:
    return PushConsumer(
        group,
        listener,
        {topic: "*"},
        transport=t,
        consume_from=ConsumeFrom.FIRST,
        consume_threads=1,
        heartbeat_interval_s=0.5,
        receive_long_poll_ms=1000,
    )


def session_cookie(driver: Any) -> str:
    return "; ".join(f"{c['name']}={c['value']}" for c in driver.get_cookies())


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, html[:500]
    return m.group(1)


def test_nothing_is_shown_without_logging_in(
    broker: ServerProcess,
    browser: Any,
    make_console: Callable[..., ConsoleProcess],
    shots: Path | None,
) -> None:
    console = make_console(broker.endpoint)
    browser.delete_all_cookies()
    for page in ("", "messages", "dlq", "topics/anything", "trace?key=x"):
        browser.get(console.url + page)
        assert "/login" in browser.current_url, page
        status, body = http(console.url + page)
        assert status == 302 and "/login" in body, (page, status)
    save(browser, shots, "login")
    login(browser, console.url, password="not-the-password", accepted=False)
    assert "wrong credentials" in by_id(browser, "login-error").text
    assert "/login" in browser.current_url
    login(browser, console.url)
    assert browser.current_url.rstrip("/") == console.url.rstrip("/")
    assert by_id(browser, "user").text == "oncall"
    # the store's disk use, against its watermarks (StoreStatus)
    admin = AdminClient(broker.endpoint)
    try:
        store = admin.call("StoreStatus")
    finally:
        admin.close()
    assert 0 < store["disk_used_ratio"] < 1 and store["commitlog_bytes"] >= 0
    assert store["watermarks"]["refuse_writes"] == 1.0  # the tests' broker: --disk-full-ratio
    shown = by_id(browser, "disk").text
    # the host's disk is shared: its use may move a little between the two readings
    assert shown.endswith("%") and abs(int(shown[:-1]) - store["disk_used_ratio"] * 100) < 3
    # scripts may read with HTTP basic auth, and only with the right password
    assert http(console.url, user="ops", password="wrong-password")[0] == 401
    status, body = http(console.url, user="ops", password=PASSWORD)
    assert status == 200 and 'id="total-lag"' in body
    # every answer forbids framing and foreign scripts
    browser.get(console.url)
    status, body = http(console.url + "messages", cookie=session_cookie(browser))
    assert status == 200
    # logging out ends the session
    browser.find_element("css selector", "header form button").click()
    browser.get(console.url)
    assert "/login" in browser.current_url


def test_a_read_only_console_refuses_actions(
    broker: ServerProcess, browser: Any, make_console: Callable[..., ConsoleProcess]
) -> None:
    [mid] = send(broker.endpoint, [Message("ro-orders", b"order 1", keys=["ro-1"])])
    admin = AdminClient(broker.endpoint)
    try:
        admin.call("CreateGroup", name="ro-billing")
    finally:
        admin.close()
    console = make_console(broker.endpoint)  # no --allow-actions
    browser.delete_all_cookies()
    login(browser, console.url)
    assert by_id(browser, "mode").text == "read-only"
    browser.get(console.url + f"trace?key={mid}")
    assert "read-only" in by_id(browser, "read-only-note").text
    assert not browser.find_elements("id", "reconsume-form")
    # a forged POST with the session's own CSRF token is still refused, and does nothing
    cookie = session_cookie(browser)
    _, page = http(console.url + f"trace?key={mid}", cookie=cookie)
    token = csrf_of(page)
    for path, form in (
        ("reconsume", {"id": mid, "group": "ro-billing", "step": "confirm"}),
        ("dlq/ro-billing/replay", {"id": mid, "step": "confirm"}),
    ):
        status, body = http(console.url + path, data={"csrf": token, **form}, cookie=cookie)
        assert status == 403 and "read-only" in body, (path, status, body[:300])
    admin = AdminClient(broker.endpoint)
    try:
        copies = admin.call("QueryMessage", id=mid)["messages"]
    finally:
        admin.close()
    assert [c["topic"] for c in copies] == ["ro-orders"]  # no copy was made


def test_an_action_needs_the_csrf_token_and_the_same_origin(
    broker: ServerProcess, browser: Any, make_console: Callable[..., ConsoleProcess]
) -> None:
    [mid] = send(broker.endpoint, [Message("csrf-orders", b"order 1", keys=["csrf-1"])])
    console = make_console(broker.endpoint, "--allow-actions")
    browser.delete_all_cookies()
    login(browser, console.url)
    cookie = session_cookie(browser)
    form = {"id": mid, "group": "csrf-billing", "step": "confirm"}
    status, body = http(console.url + "reconsume", data=form, cookie=cookie)
    assert status == 403 and "CSRF" in body
    status, body = http(console.url + "reconsume", data={**form, "csrf": "forged"}, cookie=cookie)
    assert status == 403 and "CSRF" in body
    _, page = http(console.url + "messages", cookie=cookie)
    status, body = http(
        console.url + "reconsume",
        data={**form, "csrf": csrf_of(page)},
        cookie=cookie,
        headers={"Origin": "http://evil.example"},
    )
    assert status == 403 and "another site" in body
    # without a session, basic auth does not allow actions either
    status, _ = http(console.url + "reconsume", data=form, user="x", password=PASSWORD)
    assert status == 401
    # the same form with the session's token, from the console's own page, is done
    admin = AdminClient(broker.endpoint)
    try:
        admin.call("CreateGroup", name="csrf-billing")
        status, body = http(
            console.url + "reconsume",
            data={**form, "csrf": csrf_of(page)},
            cookie=cookie,
            headers={"Origin": console.url.rstrip("/")},
        )
        assert status == 200 and 'id="done"' in body, body[:500]
        copies = wait_for(
            lambda: [
                m
                for m in admin.call("QueryMessage", id=mid)["messages"]
                if m["topic"] != "csrf-orders"
            ],
            10,
        )
    finally:
        admin.close()
    assert [c["topic"] for c in copies] == ["%RETRY%csrf-billing"]
    assert copies[0]["properties"]["OPERATOR"] == "console:oncall"


def test_search_a_message_by_key_and_open_its_trace(
    broker: ServerProcess,
    browser: Any,
    make_console: Callable[..., ConsoleProcess],
    shots: Path | None,
) -> None:
    from selenium.webdriver.support.ui import Select

    topic, group = "search-orders", "search-billing"
    done = threading.Event()

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if any(m.keys == ["order-42"] for m in messages):
            done.set()
        return ConsumeResult.SUCCESS

    t = grpc_transport(broker.endpoint)
    try:
        with consumer(t, group, topic, listener), Producer(t) as producer:
            for i in range(40, 45):
                producer.send(
                    Message(topic, f"order {i}".encode(), keys=[f"order-{i}"], tags="created")
                )
            assert done.wait(30)

            console = make_console(broker.endpoint)
            browser.delete_all_cookies()
            login(browser, console.url)

            def acknowledged() -> bool:
                browser.get(console.url + "trace?key=order-42")
                return any(
                    e.get_attribute("data-kind") == "acknowledged"
                    for e in browser.find_elements("css selector", "li.event")
                )

            wait_for(acknowledged, 30, 0.5)
    finally:
        t.close()

    browser.get(console.url + "messages")
    Select(by_id(browser, "by")).select_by_value("key")
    by_id(browser, "value").send_keys("order-42")
    Select(by_id(browser, "topic")).select_by_visible_text(topic)
    by_id(browser, "search-button").click()
    # the form's GET loads the results page: read it once it is there, not the form's page
    wait_for(lambda: "value=order-42" in browser.current_url, 10)
    rows = wait_for(lambda: browser.find_elements("css selector", "#results tr")[1:], 10)
    assert len(rows) == 1 and "order-42" in rows[0].text and topic in rows[0].text
    save(browser, shots, "messages")
    uniq = rows[0].find_element("css selector", "a.trace-link").text  # the client's id
    rows[0].find_element("css selector", "a.trace-link").click()
    wait_for(lambda: "/trace" in browser.current_url, 10)
    kinds = [
        e.get_attribute("data-kind") for e in browser.find_elements("css selector", "li.event")
    ]
    assert kinds[0] == "original" and "delivered" in kinds and kinds[-1] == "acknowledged"
    state = browser.find_element("css selector", f'[data-group="{group}"]').text
    assert state == "acknowledged"
    assert "order-42" in by_id(browser, "records").text
    offset_id = browser.find_element("css selector", "#records td.mono").text
    save(browser, shots, "trace")
    # another key finds nothing, and says so
    browser.get(console.url + f"messages?by=key&value=order-99&topic={topic}")
    assert by_id(browser, "no-results").text == "no message found"
    # the other forms: message id (any topic), unique key, a time range of the topic
    found = {}
    for form in (
        f"by=id&value={offset_id}",
        f"by=unique_key&value={uniq}&topic={topic}",
        f"by=time&topic={topic}",
        f"by=time&topic={topic}&limit=2",
    ):
        browser.get(console.url + "messages?" + form)
        found[form] = [r.text for r in browser.find_elements("css selector", "#results tr")[1:]]
    forms = list(found)
    assert len(found[forms[0]]) == 1 and "order-42" in found[forms[0]][0]
    assert len(found[forms[1]]) == 1 and "order-42" in found[forms[1]][0]
    assert [r.split()[5] for r in found[forms[2]]] == [f"order-{i}" for i in range(44, 39, -1)]
    assert len(found[forms[3]]) == 2 and by_id(browser, "more").is_displayed()


def test_the_lag_falls_on_the_overview_as_a_consumer_runs(
    broker: ServerProcess,
    browser: Any,
    make_console: Callable[..., ConsoleProcess],
    shots: Path | None,
) -> None:
    topic, group, count = "lag-orders", "lag-billing", 300
    admin = AdminClient(broker.endpoint)
    try:
        admin.call("CreateTopic", name=topic, queues=2)
        admin.call("CreateGroup", name=group)
        send(
            broker.endpoint,
            [Message(topic, f"order {i}".encode(), keys=[f"lag-{i}"]) for i in range(count)],
        )
        # the group starts at the first message: all of them are its lag
        admin.call("SetGroupStart", group=group, topic=topic, consume_from="FIRST")
    finally:
        admin.close()
    console = make_console(broker.endpoint)
    browser.delete_all_cookies()
    login(browser, console.url)

    def lag_shown() -> int:
        browser.get(console.url)
        return int(by_id(browser, f"lag-{group}").text.replace(",", ""))

    assert wait_for(lambda: lag_shown() == count, 20)
    seen: list[int] = []
    handled: list[int] = []

    def slow(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        time.sleep(0.03 * len(messages))  # about 30 messages a second: the fall is visible
        handled.extend(1 for _ in messages)
        return ConsumeResult.SUCCESS

    t = grpc_transport(broker.endpoint)
    try:
        with consumer(t, group, topic, slow):

            def drained() -> bool:
                seen.append(lag_shown())
                return seen[-1] == 0

            try:
                wait_for(drained, 90, 1.0)
            except AssertionError as exc:  # say how far it got
                raise AssertionError(f"{exc}; lag seen {seen}, {len(handled)} handled") from None
    finally:
        t.close()
    assert len(handled) >= count
    between = [v for v in seen if 0 < v < count]
    assert between, seen  # seen on its way down, not only before and after
    assert seen == sorted(seen, reverse=True), seen  # it only ever fell
    # the chart drew the same fall: its line for the group ends at 0 after a higher point
    chart = by_id(browser, "chart-lag")
    line = chart.find_element("css selector", f'polyline[data-name="{group}"]')
    assert line.get_attribute("data-last") == "0"
    ys = [float(p.split(",")[1]) for p in line.get_attribute("points").split()]
    assert min(ys) < ys[-1]  # an earlier point was higher on the chart (smaller y)
    browser.get(console.url + f"groups/{group}")
    assert by_id(browser, "group-lag").text == "0"
    save(browser, shots, "group")
    browser.get(console.url + f"topics/{topic}")
    assert by_id(browser, "held").text == f"{count:,}"
    save(browser, shots, "topic")
    browser.get(console.url)
    save(browser, shots, "overview")


def test_replay_one_dead_letter_and_see_it_consumed(
    broker: ServerProcess,
    browser: Any,
    make_console: Callable[..., ConsoleProcess],
    shots: Path | None,
) -> None:
    topic, group = "dlq-orders", "dlq-billing"
    fixed = threading.Event()
    lock = threading.Lock()
    handled: list[tuple[str, int]] = []
    consumed_after_fix = threading.Event()

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        [m] = messages
        with lock:
            handled.append((m.keys[0], m.delivery_attempt))
        if m.keys == ["poison-1"] and not fixed.is_set():
            return ConsumeResult.RECONSUME_LATER  # a bad deploy: fails until fixed
        if m.keys == ["poison-1"]:
            consumed_after_fix.set()
        return ConsumeResult.SUCCESS

    admin = AdminClient(broker.endpoint)
    t = grpc_transport(broker.endpoint)
    try:
        admin.call("CreateTopic", name=topic, queues=2)
        admin.call("CreateGroup", name=group, max_retries=1)
        with consumer(t, group, topic, listener), Producer(t) as producer:
            producer.send(Message(topic, b"order 1", keys=["ok-1"]))
            [poison] = [producer.send(Message(topic, b"order 2", keys=["poison-1"])).message_id]
            wait_for(lambda: admin.call("ListDeadLetters", group=group)["messages"], 60, 0.5)

            console = make_console(broker.endpoint, "--allow-actions")
            browser.delete_all_cookies()
            login(browser, console.url)
            assert by_id(browser, "mode").text == "actions enabled"
            wait_for(
                lambda: (browser.get(console.url), by_id(browser, f"dlq-{group}").text == "1")[1],
                20,
            )
            by_id(browser, f"dlq-{group}").click()
            wait_for(lambda: f"/dlq/{group}" in browser.current_url, 10)
            rows = wait_for(lambda: browser.find_elements("css selector", "tr.dead-letter"), 10)
            assert [r.get_attribute("data-id") for r in rows] == [poison]
            assert by_id(browser, "dlq-pending").text == "1"
            save(browser, shots, "dlq")
            fixed.set()  # the fix is deployed: replay
            rows[0].find_element("css selector", "input.pick").click()
            rate = by_id(browser, "rate")
            rate.clear()
            rate.send_keys("5")
            by_id(browser, "review-button").click()
            assert by_id(browser, "replay-count").text == "1"
            assert f"%RETRY%{group}" in by_id(browser, "preview").text
            save(browser, shots, "dlq-confirm")
            assert not consumed_after_fix.is_set()  # nothing happens before the confirmation
            by_id(browser, "confirm-button").click()
            wait_for(lambda: (browser.refresh(), by_id(browser, "job-state").text == "done")[1], 30)
            assert by_id(browser, "job-replayed").text == "1"
            assert consumed_after_fix.wait(30)  # the group consumed the replayed message
            save(browser, shots, "dlq-replayed")

            def settled() -> bool:
                browser.get(console.url + f"trace?key={poison}")
                badge = browser.find_element("css selector", f'[data-group="{group}"]')
                return badge.text == "acknowledged"

            wait_for(settled, 30, 0.5)
            kinds = [
                e.get_attribute("data-kind")
                for e in browser.find_elements("css selector", "li.event")
            ]
            assert "dead-letter" in kinds and kinds[-1] == "acknowledged"
            # the replayed dead letter is marked, and a second replay would skip it
            browser.get(console.url + f"dlq/{group}")
            assert by_id(browser, "dlq-pending").text == "0"
            assert browser.find_elements("css selector", "span.replayed")
            assert not browser.find_elements("css selector", "input.pick")
    finally:
        t.close()
        admin.close()
    with lock:
        poison_deliveries = [a for k, a in handled if k == "poison-1"]
    assert len(poison_deliveries) == 3  # two failed attempts, then the replayed copy once


def test_logging_in_with_an_access_key_the_broker_accepts(
    tmp_path: Path, browser: Any, make_console: Callable[..., ConsoleProcess]
) -> None:
    import json

    from tests.e2e.grpc.conftest import FAST

    keys = tmp_path / "access-keys.json"
    keys.write_text(json.dumps({"console": "console-secret", "alice": "alice-secret"}))
    secret = tmp_path / "console.key"
    secret.write_text("console-secret\n")
    broker = ServerProcess(
        tmp_path / "store", tmp_path, *FAST, "--credentials-file", str(keys)
    ).start()
    try:
        console = make_console(
            broker.endpoint,
            "--access-key",
            "console",
            "--secret-key-file",
            str(secret),
            password=False,
        )
        browser.delete_all_cookies()
        login(browser, console.url, user="alice", password="not-alice-secret", accepted=False)
        login(browser, console.url, user="mallory", password="alice-secret", accepted=False)
        login(browser, console.url, user="alice", password="alice-secret")
        assert by_id(browser, "user").text == "alice"
        assert by_id(browser, "topic-count").text.isdigit()  # the console reads the broker
        assert http(console.url, user="alice", password="alice-secret")[0] == 200
        assert http(console.url, user="alice", password="wrong-secret")[0] == 401
    finally:
        assert broker.terminate() == 0


def test_a_replay_keeps_its_rate_and_never_replays_twice(
    broker: ServerProcess, browser: Any, make_console: Callable[..., ConsoleProcess]
) -> None:
    topic, group, count, rate = "rate-orders", "rate-billing", 6, 2
    admin = AdminClient(broker.endpoint)
    t = grpc_transport(broker.endpoint)
    try:
        admin.call("CreateTopic", name=topic, queues=2)
        admin.call("CreateGroup", name=group, max_retries=0)  # the first failure dead-letters
        fail = consumer(t, group, topic, lambda ms, ctx: ConsumeResult.RECONSUME_LATER)
        with fail:
            send(
                broker.endpoint,
                [Message(topic, f"order {i}".encode(), keys=[f"rate-{i}"]) for i in range(count)],
            )
            wait_for(
                lambda: len(admin.call("ListDeadLetters", group=group)["messages"]) == count,
                60,
                0.5,
            )
        console = make_console(broker.endpoint, "--allow-actions")
        browser.delete_all_cookies()
        login(browser, console.url)
        browser.get(console.url + f"dlq/{group}")
        for box in browser.find_elements("css selector", "input.pick"):
            box.click()
        field = by_id(browser, "rate")
        field.clear()
        field.send_keys(str(rate))
        by_id(browser, "review-button").click()
        assert by_id(browser, "replay-count").text == str(count)
        by_id(browser, "confirm-button").click()
        started = time.monotonic()
        wait_for(
            lambda: (browser.refresh(), by_id(browser, "job-state").text == "done")[1], 30, 0.2
        )
        took = time.monotonic() - started
        assert by_id(browser, "job-replayed").text == str(count)
        # 6 at 2 a second: three calls, a second apart
        assert took >= (count / rate - 1) - 0.2, took
        audit = admin.call("DeadLetterAudit", group=group)["entries"]
        assert len(audit) == count // rate
        assert all(len(e["replayed"]) == rate for e in audit)
        listed = admin.call("ListDeadLetters", group=group)
        assert listed["pending"] == 0 and listed["replayed"] == count
        # asking again, even with a forged form naming them all, replays nothing
        cookie = session_cookie(browser)
        _, page = http(console.url + f"dlq/{group}", cookie=cookie)
        form = {"csrf": csrf_of(page), "offset": [str(o) for o in range(count)], "rate": "2"}
        status, preview = http(console.url + f"dlq/{group}/replay", data=form, cookie=cookie)
        assert status == 200 and 'id="replay-count">0<' in preview
        assert preview.count("skipped: already replayed") == count
        assert 'id="confirm-button"' not in preview
    finally:
        t.close()
        admin.close()
