"""The chat page of the deployed lab, in a real browser: Debian's headless chromium driven by Selenium.

GET / is public (llama-server lets its UI's files through without a key), the page then finds /props
locked (401) and offers "Enter API Key"; the key typed there lands in the page's settings (localStorage),
a message is sent and the reply streams in: its text appears, then grows. A screenshot goes to
docs/chat-page.png.

LLAMA_RPC_CHAT_URL points the test at another llama-server (one started by hand with the lab's key
file); without it the test brings the lab up, deploys, and opens the coordinator's page.
Needs: apt-get install chromium chromium-driver; pip install selenium.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest

from lab import lab
from llama_rpc_deploy.paths import PROJECT

from .lab_helpers import WORKERS, needs_docker, operations, pyinfra

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
URL = os.environ.get("LLAMA_RPC_CHAT_URL") or f"http://{lab.ip_of(0)}:8080/"
SCREENSHOT = PROJECT / "docs" / "chat-page.png"
PROMPT = "Write a long story about a lighthouse keeper."

pytestmark = [
    needs_docker,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs apt-get install chromium chromium-driver"),
]
webdriver = pytest.importorskip("selenium.webdriver", reason="needs pip install selenium")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# the reply's text only: the assistant message also holds "Processing...", the model's name and statistics
REPLY_TEXT = (By.CSS_SELECTOR, '[aria-label="Assistant message with actions"] .markdown-content')


@pytest.fixture(scope="module")
def page_url() -> str:
    if not os.environ.get("LLAMA_RPC_CHAT_URL"):
        lab.up(workers=WORKERS)
        operations(pyinfra("--json"))
    return URL


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()  # closes the stream too: llama-server stops generating when its client goes


def api_key() -> str:
    return (lab.LAB_DIR / "api_key").read_text().strip()


def test_page_itself_needs_no_key_and_the_api_does(page_url):
    """GET / answers the chat page's HTML without a key; the API behind it still answers 401."""
    request = urllib.request.Request(page_url, headers={"Accept-Encoding": "gzip"})  # the UI is stored gzipped
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/html")
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(page_url.rstrip("/") + "/props", timeout=30)
    assert denied.value.code == 401


def click_button(driver, text: str, timeout: float = 30) -> None:
    WebDriverWait(driver, timeout).until(
        ec.element_to_be_clickable((By.XPATH, f'//button[normalize-space(.)="{text}"]'))
    ).click()


def test_chat_page_takes_the_key_and_streams_a_reply(page_url, browser):
    browser.get(page_url)
    assert browser.execute_script("return document.readyState") == "complete"

    # the page asks the server for /props, gets 401 and offers a field for the key
    click_button(browser, "Enter API Key", timeout=60)
    field = WebDriverWait(browser, 10).until(ec.visibility_of_element_located((By.ID, "api-key-input")))
    field.send_keys(api_key())
    click_button(browser, "Save & Retry")
    WebDriverWait(browser, 30).until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "validated"))
    stored = json.loads(
        browser.execute_script(
            "for (const k of Object.keys(localStorage)) if (k.endsWith('.config')) return localStorage.getItem(k);"
            " return '{}';"
        )
    )
    assert stored.get("apiKey") == api_key()  # in the page's settings, sent with every request

    # then the chat screen: type, press Enter, watch the reply stream in
    box = WebDriverWait(browser, 60).until(ec.element_to_be_clickable((By.TAG_NAME, "textarea")))
    box.send_keys(PROMPT)
    box.send_keys(Keys.ENTER)
    WebDriverWait(browser, 30).until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), PROMPT))

    lengths, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        text = "".join(e.text for e in browser.find_elements(*REPLY_TEXT)).strip()
        lengths.append(len(text))
        if len(set(n for n in lengths if n > 0)) >= 3:  # seen non-empty at three different lengths: streaming
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"the reply did not stream in within 120 s; its lengths over time: {lengths[-40:]}")
    growing = [n for n in lengths if n > 0]
    assert growing[-1] > growing[0], lengths

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    try:  # stop the generation (the lab's model never says it is done)
        click_button(browser, "Stop", timeout=5)
    except TimeoutException:
        pass
