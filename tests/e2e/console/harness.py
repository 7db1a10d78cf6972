"""The console as a real process, and a real headless Chromium to look at it.

Chromium and its driver are Debian's (`chromium`, `chromium-driver`, installed by
scripts/ensure-system.sh); Selenium is pointed at both explicitly, and Selenium Manager is
kept offline, so nothing is downloaded when a test runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.e2e.grpc.server_process import REPO, ChildProcess

CHROMIUM = os.environ.get("RELIABLE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("RELIABLE_CHROMEDRIVER", "/usr/bin/chromedriver")
PASSWORD = "console-test-pw"
_READY = re.compile(r"serving (http://[\w.\-]+:\d+/)")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (Path(path).exists() or shutil.which(path)):
            return f"{path} is missing: run scripts/ensure-system.sh (chromium, chromium-driver)"
    return None


@contextlib.contextmanager
def chrome(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium driven through Debian's chromedriver."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never fetch a driver or browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class ConsoleProcess(ChildProcess):
    """`python -m reliable_cli console ...` on a free port."""

    def __init__(self, endpoint: str, *extra: str, password_file: Path | None = None) -> None:
        self.endpoint = endpoint
        self.extra = extra
        self.password_file = password_file
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.url = ""

    def start(self, timeout_s: float = 30.0) -> ConsoleProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        auth = ("--password-file", str(self.password_file)) if self.password_file else ()
        cmd = [
            sys.executable,
            "-m",
            "reliable_cli",
            "console",
            "--endpoint",
            self.endpoint,
            "--port",
            "0",
            "--sample-interval",
            "1",
            *auth,
            *self.extra,
        ]
        self._launch(cmd, env, "console", timeout_s)
        return self

    def _pumped(self, line: str, ready: threading.Event) -> None:
        m = _READY.search(line)
        if m and not ready.is_set():
            self.url = m.group(1)
            ready.set()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.3) -> Any:
    """The first truthy result of `check`, or AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"not reached within {timeout_s} s (last: {last!r})")


def login(
    driver: Any, url: str, password: str = PASSWORD, user: str = "oncall", *, accepted: bool = True
) -> None:
    """Log in through the form; wait for the page after it (or for the refusal)."""
    from selenium.webdriver.common.by import By

    driver.get(url + "login")
    driver.find_element(By.ID, "user-field").send_keys(user)
    driver.find_element(By.ID, "password-field").send_keys(password)
    driver.find_element(By.ID, "login-button").click()
    if accepted:
        wait_for(lambda: "/login" not in driver.current_url, 10)
    else:
        wait_for(lambda: driver.find_elements(By.ID, "login-error"), 10)


def http(
    url: str,
    *,
    data: dict[str, Any] | None = None,
    user: str | None = None,
    password: str | None = None,
    cookie: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """(status, body) of one request outside the browser (redirects are not followed)."""
    import base64

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    body = urllib.parse.urlencode(data, doseq=True).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers=dict(headers or {}))
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    if cookie is not None:
        req.add_header("Cookie", cookie)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def save(driver: Any, directory: Path | None, name: str) -> None:
    """A full-page screenshot `<directory>/<name>.png` (when a directory is given)."""
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
    # the page's own height (where its content ends), whatever the window's
    page = int(
        driver.execute_script(
            "const m = document.querySelector('main');"
            "return Math.ceil(m.getBoundingClientRect().bottom + window.scrollY);"
        )
    )
    chrome_px = height - int(driver.execute_script("return window.innerHeight"))
    driver.set_window_size(width, max(360, min(page + 8, 3000)) + chrome_px)
    time.sleep(0.3)  # let the resized page settle before it is captured
    driver.save_screenshot(str(directory / f"{name}.png"))
    driver.set_window_size(width, height)
