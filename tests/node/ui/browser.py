"""Headless Chromium for the dashboard's tests: Debian's `chromium` and `chromium-driver`
(never downloaded at test time), waits on conditions, screenshots, console errors, and the
accessibility checks (axe-core, vendored: vendor/axe-4.10.3.min.js, MPL-2.0)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.skips import skip_unless_required

AXE = Path(__file__).resolve().parent / "vendor" / "axe-4.10.3.min.js"
DESKTOP = (1280, 720)
PHONE = (390, 844)
T = TypeVar("T")


def chromium_paths() -> tuple[str, str]:
    """(browser, driver) executables; skips (fails under CI) when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        skip_unless_required(
            "the dashboard's browser tests need Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/sysdeps.sh installs them in CI)"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        skip_unless_required("the dashboard's browser tests need selenium (pip install -e .[test])")
    return browser, driver


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by selenium, its console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def until(check: Callable[[], T], timeout_s: float, what: str, step_s: float = 0.05) -> T:
    """The first truthy value of `check()` within `timeout_s`; fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # a page between two renders: try again
            last_error = exc
        else:
            if value:
                return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} ({last_error})")


def screenshot(driver: Any, folder: Path, name: str) -> Path:
    """A PNG of the page under `folder` (the test's output directory)."""
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def console_errors(driver: Any) -> list[str]:
    """Console messages of level SEVERE since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def axe_violations(driver: Any) -> list[str]:
    """WCAG 2 A and AA violations axe-core finds on the page (labels, contrast, ...)."""
    driver.execute_script(AXE.read_text(encoding="utf-8"))
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}})"
        ".then((r) => done(r.violations.map((v) => v.id + ': ' + v.help + ' at ' +"
        " v.nodes.map((n) => n.target.join(' ')).slice(0, 3).join(', '))))"
        ".catch((e) => done(['axe failed: ' + e]));"
    )
    return list(result)


def fits_width(driver: Any) -> bool:
    """No horizontal scrolling of the page itself (wide tables scroll inside their box)."""
    return bool(
        driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1;"
        )
    )
