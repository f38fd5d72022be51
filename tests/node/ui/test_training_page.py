"""The training page in a real browser (headless Chromium) against a daemon whose fake ranks
report (tests/node/ui/fake_training.py): every rank's step advancing without a reload, the slow
rank marked a straggler, sparklines of its series and of the GPUs, a restart with its reason,
a GPU fault's quarantine, no console error (the favicon answers), axe-core's WCAG checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.ui.browser import (
    PHONE,
    axe_violations,
    chromium,
    chromium_paths,
    console_errors,
    fits_width,
    screenshot,
    until,
)
from tests.node.ui.fake_training import FakeRanks, call, training_daemon

RANKS = 4
SLOW = 2
NODE = "gpu-host-1"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[str, FakeRanks]]:
    chromium_paths()
    with training_daemon(tmp_path, RANKS) as (url, gpus_file):
        ranks = FakeRanks(url, RANKS, gpus_file, slow=SLOW)
        ranks.start()
        try:
            yield url, ranks
        finally:
            ranks.stop()


def _rows(driver: Any) -> dict[str, tuple[int, str]]:
    found = driver.execute_script(
        "return [...document.querySelectorAll('tr[data-rank]')]"
        ".map((r) => [r.dataset.rank, Number(r.dataset.step), r.dataset.straggler]);"
    )
    return {rank: (step, straggler) for rank, step, straggler in found}


def _points(driver: Any, key: str) -> int:
    selector = f"svg.plot[data-key='{key}']"
    return int(driver.execute_script(
        "const p = document.querySelector(arguments[0]); return p ? p.dataset.points : 0;",
        selector,
    ))  # fmt: skip


@pytest.mark.timeout(240)
def test_the_training_page_shows_ranks_advancing_a_straggler_a_restart_and_a_quarantine(
    fake: tuple[str, FakeRanks], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    url, ranks = fake
    with chromium() as browser:
        browser.get(f"{url}/ui/#training")
        until(lambda: browser.find_element(By.ID, "live").text == "live", 15, "the stream")
        browser.execute_script("window.shoalNotReloaded = true;")
        first = until(lambda: _rows(browser).get("0", (0, ""))[0], 30, "rank 0's step")
        until(lambda: len(_rows(browser)) == RANKS, 15, f"{RANKS} ranks' rows")
        until(lambda: _rows(browser)["0"][0] > first, 15, "rank 0's step advancing")
        until(lambda: _rows(browser)[str(SLOW)][1] == "true", 45, f"rank {SLOW} a straggler")
        assert {rank for rank, (_, slow) in _rows(browser).items() if slow == "true"} == {"2"}
        assert browser.find_element(By.ID, "stragglers").text == f"rank {SLOW}"
        until(lambda: _points(browser, "steps_per_s|0") >= 2, 30, "rank 0's steps/s plotted")
        until(lambda: _points(browser, f"gpu|{NODE}|0|util") >= 1, 30, "GPU 0's utilization")
        assert _points(browser, "scalar:loss|3") >= 1, "every scalar plotted per rank"
        screenshot(browser, tmp_path, "training")
        body = {"generation": ranks.generation, "reason": "worker_exit", "detail": "rank 3 exit"}
        call(url, "/v1/training/restart", body)
        until(lambda: "worker_exit" in browser.find_element(By.ID, "main").text, 20, "the restart")
        assert browser.find_elements(
            By.CSS_SELECTOR, "svg.plot line.restart[data-reason='worker_exit']"
        )
        assert browser.find_element(By.ID, "quarantined").text == "none"
        ranks.xids = (79,)
        row = f"tr[data-quarantine='{NODE}']"
        until(lambda: browser.find_elements(By.CSS_SELECTOR, row), 30, "the GPU quarantine")
        quarantine = browser.find_element(By.CSS_SELECTOR, row)
        assert quarantine.get_attribute("data-state") == "quarantined"
        assert "Xid 79" in quarantine.text
        assert browser.find_element(By.ID, "quarantined").text == NODE
        assert browser.execute_script("return window.shoalNotReloaded === true;")
        problems = axe_violations(browser) + console_errors(browser)
        browser.set_window_size(*PHONE)
        if not fits_width(browser):
            problems.append("the training page scrolls sideways at 390 px")
        assert not problems, "\n".join(problems)
