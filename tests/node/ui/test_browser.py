"""The dashboard in a real browser (headless Chromium) against a 3-node dev cluster: members
live, a SIGKILLed node shown dead and back without a reload, a CLI job's log followed, a sync's
bytes rising, the login, the headers, console errors and accessibility at two sizes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.node.test_dev_cluster import ROOT, _free_base_port, _until
from tests.node.ui.browser import (
    DESKTOP,
    PHONE,
    axe_violations,
    chromium,
    chromium_paths,
    console_errors,
    fits_width,
    screenshot,
    until,
)

TOKEN = "dashboard-read-token-of-the-browser-tests"
SYNC_FILES = 8
SYNC_FILE_BYTES = 2 * 1024 * 1024
UPLOAD_LIMIT_BYTES_S = 4 * 1024 * 1024
"""The source's upload cap: the sync of SYNC_FILES takes seconds, so its bytes visibly rise."""
PAGES = ("cluster", "jobs", "runs", "sync", "rl", "node")


@dataclass(frozen=True)
class DevCluster:
    base: int
    data_dir: Path
    env: dict[str, str]

    def url(self, index: int = 1, path: str = "/ui/") -> str:
        return f"http://127.0.0.1:{self.base + index - 1}{path}"

    def shoal(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "node", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60, env=self.env,
        )  # fmt: skip

    def pid(self, name: str) -> int:
        nodes = json.loads((self.data_dir / "dev-cluster.json").read_text())["nodes"]
        return int(next(node["pid"] for node in nodes if node["name"] == name))


def _config(root: Path) -> Path:
    token = root / "ui-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    config = root / "shoal.yaml"
    config.write_text(
        "mdns: false\n"
        f"ui_token_file: {token}\n"
        "sync_interval_s: 0\n"
        f"sync_upload_limit_bytes_s: {UPLOAD_LIMIT_BYTES_S}\n"
        "timeouts: {probe_interval_s: 0.1, probe_timeout_s: 0.05, "
        "indirect_probe_timeout_s: 0.1, suspicion_s: 0.3}\n"
    )
    return config


def _read_json(request: urllib.request.Request) -> Any:
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def _alive_members(cluster: DevCluster) -> int:
    with urllib.request.urlopen(cluster.url(1, "/v1/peers"), timeout=2) as answer:
        members = json.loads(answer.read())["members"]
    return sum(member["state"] == "alive" for member in members)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    chromium_paths()
    root = tmp_path_factory.mktemp("dashboard")
    env = {**os.environ, "SHOAL_CONFIG": str(_config(root)), "COLUMNS": "200"}
    base = _free_base_port(3)
    data_dir = root / "dev"
    process = subprocess.Popen(
        [sys.executable, "-m", "node", "dev-cluster", "--nodes", "3", "--base-port", str(base),
         "--data-dir", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    dev = DevCluster(base, data_dir, env)
    try:
        _until(lambda: _alive_members(dev) == 3, 60, "3 alive dev nodes")
        yield dev
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)


@pytest.fixture(scope="module")
def browser(cluster: DevCluster) -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def _log_in(driver: Any, cluster: DevCluster, token: str = TOKEN) -> None:
    from selenium.webdriver.common.by import By

    driver.get(cluster.url(1, "/ui/login"))
    field = until(lambda: driver.find_element(By.ID, "token"), 10, "the token field")
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def _open(driver: Any, cluster: DevCluster, page: str, index: int = 1) -> None:
    """Open the dashboard's `page` (logging in when needed) and wait for it to be live."""
    from selenium.webdriver.common.by import By

    driver.get(cluster.url(index, f"/ui/#{page}"))
    if "/ui/login" in driver.current_url:
        _log_in(driver, cluster)
        driver.get(cluster.url(index, f"/ui/#{page}"))
    until(lambda: driver.find_element(By.ID, "live").text == "live", 15, "the event stream")


def _member_states(driver: Any) -> dict[str, str]:
    rows = driver.execute_script(
        "return [...document.querySelectorAll('tr[data-node]')]"
        ".map((row) => [row.dataset.node, row.dataset.state]);"
    )
    return dict(rows)


@pytest.mark.timeout(180)
def test_login_refuses_a_wrong_token_and_data_routes_answer_401_without_the_cookie(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(cluster.url(1, "/v1/events?topics=status"), timeout=5)
    refused.value.close()
    assert refused.value.code == 401
    with urllib.request.urlopen(cluster.url(1, "/ui/"), timeout=5) as answer:  # to the login
        assert answer.url.endswith("/ui/login")
        csp = answer.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert answer.headers["X-Frame-Options"] == "DENY"
    browser.delete_all_cookies()
    _log_in(browser, cluster, "not-the-token")
    message = until(lambda: browser.find_element(By.ID, "message").text, 10, "the refusal")
    assert "Wrong token" in message
    assert "/ui/login" in browser.current_url
    assert not browser.get_cookies()
    screenshot(browser, tmp_path, "login-refused")
    _log_in(browser, cluster)
    until(lambda: browser.find_element(By.ID, "live").text == "live", 15, "the dashboard")
    (cookie,) = browser.get_cookies()
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    assert TOKEN not in browser.page_source


@pytest.mark.timeout(180)
def test_cluster_page_shows_a_killed_member_dead_within_5_s_and_back_without_reload(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    _open(browser, cluster, "cluster")
    until(lambda: set(_member_states(browser).values()) == {"alive"}
          and len(_member_states(browser)) == 3, 20, "3 alive members")  # fmt: skip
    screenshot(browser, tmp_path, "cluster")
    browser.execute_script("window.shoalNotReloaded = true;")
    os.kill(cluster.pid("dev-2"), signal.SIGKILL)
    killed_at = time.monotonic()
    until(lambda: _member_states(browser).get("dev-2") == "dead", 10, "dev-2 shown dead")
    shown_s = time.monotonic() - killed_at
    print(f"the page showed dev-2 dead {shown_s:.2f} s after SIGKILL")
    assert shown_s < 5.0
    screenshot(browser, tmp_path, "cluster-dead")
    restarted = cluster.shoal(
        "dev-cluster", "restart", "dev-2", "--data-dir", str(cluster.data_dir)
    )
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    until(lambda: _member_states(browser).get("dev-2") == "alive", 60, "dev-2 shown alive again")
    assert browser.execute_script("return window.shoalNotReloaded === true;")
    screenshot(browser, tmp_path, "cluster-back")


def _member_drains(driver: Any) -> dict[str, str]:
    rows = driver.execute_script(
        "return [...document.querySelectorAll('tr[data-node]')]"
        ".map((row) => [row.dataset.node, row.dataset.drain]);"
    )
    return dict(rows)


@pytest.mark.timeout(180)
def test_cluster_page_shows_a_drained_member_and_its_undrain_without_reload(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, cluster, "cluster")
    until(lambda: _member_drains(browser).get("dev-3") == "no", 20, "dev-3 shown not draining")
    browser.execute_script("window.shoalNotReloaded = true;")
    drained = cluster.shoal("node", "drain", "dev-3", "--node", cluster.url(1, ""))
    assert drained.returncode == 0, drained.stdout + drained.stderr
    until(lambda: _member_drains(browser).get("dev-3") == "draining", 15, "dev-3 shown draining")
    assert browser.find_element(By.ID, "draining").text == "dev-3"
    screenshot(browser, tmp_path, "cluster-drain")
    undrained = cluster.shoal("node", "undrain", "dev-3", "--node", cluster.url(1, ""))
    assert undrained.returncode == 0, undrained.stdout + undrained.stderr
    until(lambda: _member_drains(browser).get("dev-3") == "no", 15, "dev-3 shown undrained")
    assert browser.find_element(By.ID, "draining").text == "none"
    assert browser.execute_script("return window.shoalNotReloaded === true;")


@pytest.mark.timeout(180)
def test_a_cli_job_appears_and_its_log_lines_arrive_live(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    go = tmp_path / "go"
    code = (
        "import os, time\n"
        "print('first line of the job', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('second line of the job', flush=True)\n"
    )
    _open(browser, cluster, "jobs")
    started = cluster.shoal("jobs", "run", "--node", cluster.url(1, ""), "--name", "ui-test",
                            "--", sys.executable, "-c", code)  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    job_id = started.stdout.strip()
    link = until(lambda: browser.find_element(By.CSS_SELECTOR, f"tr[data-job='{job_id}'] a"),
                 15, "the job's row")  # fmt: skip
    screenshot(browser, tmp_path, "jobs")
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("failed")
    until(lambda: not browser.find_elements(By.CSS_SELECTOR, f"tr[data-job='{job_id}']"),
          5, "the running job filtered out")  # fmt: skip
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("running")
    link = until(lambda: browser.find_element(By.CSS_SELECTOR, f"tr[data-job='{job_id}'] a"),
                 5, "the running job shown")  # fmt: skip
    link.click()
    stdout = lambda: browser.find_element(By.ID, "log-stdout").text  # noqa: E731
    until(lambda: "first line of the job" in stdout(), 15, "the job's first line")
    browser.execute_script("window.shoalNotReloaded = true;")
    go.touch()
    written_at = time.monotonic()
    until(lambda: "second line of the job" in stdout(), 15, "the job's second line")
    print(f"the second line was shown {time.monotonic() - written_at:.2f} s after its go")
    assert browser.execute_script("return window.shoalNotReloaded === true;")
    screenshot(browser, tmp_path, "job-log")


@pytest.mark.timeout(180)
def test_the_sync_page_shows_a_transfers_bytes_rising(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    models = cluster.data_dir / "dev-2" / "models"
    models.mkdir(parents=True, exist_ok=True)
    for index in range(SYNC_FILES):
        (models / f"shard-{index}.bin").write_bytes(os.urandom(SYNC_FILE_BYTES))
    _open(browser, cluster, "sync")
    body = json.dumps({"categories": ["models"], "from": "dev-2"}).encode()
    request = urllib.request.Request(
        cluster.url(1, "/v1/sync/run"), data=body, headers={"Content-Type": "application/json"}
    )
    answers: list[Any] = []
    runner = threading.Thread(target=lambda: answers.append(_read_json(request)), name="sync-run")
    runner.start()
    seen: list[int] = []
    total = SYNC_FILES * SYNC_FILE_BYTES

    def bytes_shown() -> bool:
        shown = int(browser.find_element(By.ID, "sync-progress").get_attribute("data-bytes"))
        if shown and (not seen or seen[-1] != shown):
            seen.append(shown)
            if len(seen) == 2:
                screenshot(browser, tmp_path, "sync")
        return shown >= total

    until(bytes_shown, 90, "every byte of the sync shown")
    runner.join(timeout=60)
    print(f"bytes shown while syncing: {seen}")
    assert answers, "the sync run did not answer"
    assert answers[0]["files"]["models"]["bytes_transferred"] == total, answers
    assert len(seen) >= 2, seen
    assert seen == sorted(seen), seen
    row = "tr[data-category='models']"
    until(lambda: "16.0 MiB" in browser.find_element(By.CSS_SELECTOR, row).text, 10, "the run")


@pytest.mark.timeout(180)
def test_every_page_has_no_console_errors_and_passes_axe_at_two_sizes(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    _open(browser, cluster, "cluster")
    console_errors(browser)  # drop what the login before left
    problems = []
    for width, height in (DESKTOP, PHONE):
        browser.set_window_size(width, height)
        for page in PAGES:
            _open(browser, cluster, page)
            problems += [f"{page} at {width}x{height}: {v}" for v in axe_violations(browser)]
            if not fits_width(browser):
                problems.append(f"{page} at {width}x{height}: the page scrolls sideways")
            if page in ("cluster", "node"):
                screenshot(browser, tmp_path, f"{page}-{width}x{height}")
    browser.set_window_size(*DESKTOP)
    problems += console_errors(browser)
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(180)
def test_a_gang_jobs_members_are_listed_by_rank(
    cluster: DevCluster, browser: Any, tmp_path: Path
) -> None:
    started = cluster.shoal("jobs", "run", "--node", cluster.url(1, ""), "--nodes", "2",
                            "--", sys.executable, "-c", "print('gang member')")  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    job_id = started.stdout.strip()
    _open(browser, cluster, f"job/{job_id}")
    caption = "Every member of this gang job, by rank"
    rows = lambda: browser.execute_script(  # noqa: E731
        "const table = [...document.querySelectorAll('table')].find("
        "(t) => t.caption && t.caption.textContent === arguments[0]);"
        "return table ? [...table.tBodies[0].rows].map((r) => r.cells[1].textContent) : [];",
        caption,
    )
    nodes = until(lambda: len(rows()) == 2 and rows(), 30, "the gang's two members")
    assert set(nodes) <= {"dev-1", "dev-2", "dev-3"}
    screenshot(browser, tmp_path, "gang")
