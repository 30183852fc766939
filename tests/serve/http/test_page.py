"""The live page (``dllm/serve/http/static``) in a real browser: Debian's headless Chromium driven by Selenium
against a live ``dllm serve`` app on 127.0.0.1 with the embedded tiny-llada.

The page streams /v1/completions with ``dllm_events``; its final text must equal what the API returns
for the same request (the official ``openai`` client, not streamed), its canvas must end with every
position committed and coloured by its step, and a screenshot is written to the test's tmp dir.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("DLLM_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DLLM_CHROMEDRIVER", "/usr/bin/chromedriver")
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip(f"the page test needs Chromium and its driver ({CHROMIUM}, {CHROMEDRIVER}: Debian's chromium "
                f"and chromium-driver packages); not installed here", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="the page test needs selenium (pip install selenium)")
openai = pytest.importorskip("openai", reason="the page test checks the page against the openai client")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow  # a browser, a server and a model: ~20 s on a busy 2-core machine

MODEL = "tiny-llada"
PROMPT = "[BOS] sort D A C B [SEP]"
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,900")


API_KEY = "page-test-key"


@pytest.fixture(scope="module")
def engine():
    import dllm
    from dllm.serve.backends.diffusion import DiffusionBackend
    from dllm.settings import DecodeSettings

    engine = DiffusionBackend(dllm.load(MODEL), name=MODEL, defaults=DecodeSettings())
    yield engine
    engine.close(drain=False)


@pytest.fixture(scope="module")
def server(engine):
    from dllm.eval.bench.serving.loopback import serve_in_thread
    from dllm.serve.http.app import create_app

    with serve_in_thread(create_app(engine), ready_path="/health") as live:
        yield live


@pytest.fixture(scope="module")
def keyed_server(engine):
    """The same engine behind an app with ``api_key``: /v1/ needs ``Authorization: Bearer``."""
    from dllm.eval.bench.serving.loopback import serve_in_thread
    from dllm.serve.http.app import create_app

    with serve_in_thread(create_app(engine, api_key=API_KEY), ready_path="/health") as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="dllm-page-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*BROWSER_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def screenshot(browser, tmp_path: Path, name: str) -> Path:
    """A PNG of the page in the test's tmp dir (and in $DLLM_PAGE_SCREENSHOTS when set: CI keeps them)."""
    shot = tmp_path / name
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5_000
    keep = os.environ.get("DLLM_PAGE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / name)
    return shot


def api_reply(client, prompt: str, max_tokens: int, sampler: str, cache: str):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body={"sampler": sampler, "cache": cache})


def api_text(client, prompt: str, max_tokens: int, sampler: str, cache: str) -> str:
    return api_reply(client, prompt, max_tokens, sampler, cache).choices[0].text


def open_page(browser, server) -> None:
    browser.get(server.url + "/")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state")
                                     in ("ready", "error"))
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready", page_error(browser)


def page_error(browser) -> str:
    return " | ".join(e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, ".error"))


def set_settings(browser, pane: str, *, sampler: str, cache: str, max_tokens: int, options: str = "") -> None:
    root = browser.find_element(By.ID, pane)
    Select(root.find_element(By.CSS_SELECTOR, "[data-field=sampler]")).select_by_value(sampler)
    Select(root.find_element(By.CSS_SELECTOR, "[data-field=cache]")).select_by_value(cache)
    for name, value in (("max_tokens", str(max_tokens)), ("options", options), ("temperature", "0")):
        field = root.find_element(By.CSS_SELECTOR, f"[data-field={name}]")
        field.clear()
        field.send_keys(value)


def set_prompt(browser, element_id: str, prompt: str) -> None:
    field = browser.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(prompt)


def run_watch(browser, prompt: str, max_tokens: int) -> dict:
    """The Watch tab run on ``prompt`` with ``max_tokens`` (its other settings as they are): its result."""
    set_prompt(browser, "prompt", prompt)
    field = browser.find_element(By.ID, "watch-settings").find_element(By.CSS_SELECTOR, "[data-field=max_tokens]")
    field.clear()
    field.send_keys(str(max_tokens))
    browser.find_element(By.ID, "run").click()
    wait_finished(browser, ("watch-run",))
    return run_result(browser, "watch-run")


def wait_finished(browser, run_ids: tuple[str, ...], timeout: float = 90) -> None:
    WebDriverWait(browser, timeout).until(
        lambda d: all(d.find_element(By.ID, i).get_attribute("data-state") in ("done", "error") for i in run_ids))


def run_result(browser, run_id: str) -> dict:
    root = browser.find_element(By.ID, run_id)
    cells = root.find_elements(By.CSS_SELECTOR, "[data-role=canvas] .cell")
    stat = lambda name: root.find_element(By.CSS_SELECTOR, f"[data-stat={name}]").get_attribute("textContent")
    return {"state": root.get_attribute("data-state"),
            "text": root.find_element(By.CSS_SELECTOR, "[data-role=text]").get_attribute("textContent"),
            "error": root.find_element(By.CSS_SELECTOR, "[data-role=error]").get_attribute("textContent"),
            "cells": [c.get_attribute("textContent") for c in cells],
            "masked": sum("masked" in c.get_attribute("class") for c in cells),
            "colours": {c.value_of_css_property("background-color") for c in cells},
            "nfe": stat("nfe"), "tpf": stat("tpf"), "tps": stat("tps")}


def test_watch_tab_text_equals_the_api_and_canvas_is_filled(server, client, browser, tmp_path):
    open_page(browser, server)
    set_prompt(browser, "prompt", PROMPT)
    set_settings(browser, "watch-settings", sampler="low_confidence", cache="none", max_tokens=8)
    browser.find_element(By.ID, "run").click()
    wait_finished(browser, ("watch-run",))
    page = run_result(browser, "watch-run")
    screenshot(browser, tmp_path, "page-watch.png")
    assert page["state"] == "done", page["error"]

    reply = api_reply(client, PROMPT, 8, "low_confidence", "none")
    assert page["text"] == reply.choices[0].text
    assert page["text"].strip(), "tiny-llada answers a sort prompt with words"
    # the canvas: one cell per generated position, all committed, one token per step -> 8 distinct colours
    assert len(page["cells"]) == 8 and page["masked"] == 0
    assert len(page["colours"]) == 8
    assert " ".join(page["cells"]).startswith(page["text"].strip())
    # one token per step: 8 forwards; tokens per forward counts the answer's tokens (EOS excluded)
    assert int(page["nfe"]) == 8 and page["tpf"] == f"{reply.usage.completion_tokens / 8:.2f}"
    assert float(page["tps"]) > 0


def test_side_by_side_tab_runs_two_settings(server, client, browser, tmp_path):
    open_page(browser, server)
    browser.find_element(By.ID, "tab-compare").click()
    set_prompt(browser, "cmp-prompt", PROMPT)
    set_settings(browser, "a-settings", sampler="low_confidence", cache="none", max_tokens=8)
    set_settings(browser, "b-settings", sampler="threshold", cache="dual", max_tokens=8, options="threshold=0.5")
    browser.find_element(By.ID, "cmp-run").click()
    wait_finished(browser, ("a-run", "b-run"))
    a, b = run_result(browser, "a-run"), run_result(browser, "b-run")
    screenshot(browser, tmp_path, "page-side-by-side.png")
    assert a["state"] == "done" and b["state"] == "done", (a["error"], b["error"])

    assert a["text"] == api_text(client, PROMPT, 8, "low_confidence", "none")
    assert b["text"] == api_text(client, PROMPT, 8, "threshold:threshold=0.5", "dual")
    assert a["masked"] == b["masked"] == 0
    assert int(b["nfe"]) < int(a["nfe"]) == 8  # a threshold of 0.5 commits several tokens per step


def test_a_bad_option_shows_the_servers_error(server, browser):
    open_page(browser, server)
    set_settings(browser, "watch-settings", sampler="threshold", cache="none", max_tokens=4,
                 options="no_such_option=1")
    browser.find_element(By.ID, "run").click()
    wait_finished(browser, ("watch-run",))
    page = run_result(browser, "watch-run")
    assert page["state"] == "error"
    assert "400" in page["error"] and "no_such_option" in page["error"]


def test_picking_another_sampler_clears_the_options(server, client, browser):
    """Options belong to one sampler: after threshold=0.5 on `threshold`, picking `low_confidence`
    empties the field, so the run is not refused for an option low_confidence lacks."""
    open_page(browser, server)
    root = browser.find_element(By.ID, "watch-settings")
    sampler = Select(root.find_element(By.CSS_SELECTOR, "[data-field=sampler]"))
    options = root.find_element(By.CSS_SELECTOR, "[data-field=options]")
    sampler.select_by_value("threshold")
    options.send_keys("threshold=0.5")
    sampler.select_by_value("low_confidence")
    assert options.get_attribute("value") == ""
    page = run_watch(browser, PROMPT, 6)
    assert page["state"] == "done", page["error"]
    assert page["text"] == api_text(client, PROMPT, 6, "low_confidence", "none")


def test_a_server_with_an_api_key_asks_for_it(keyed_server, browser):
    from selenium.webdriver.common.keys import Keys

    browser.get(keyed_server.url + "/")
    body = lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state")  # noqa: E731
    WebDriverWait(browser, 30).until(lambda d: body(d) in ("ready", "error"))
    assert body(browser) == "error" and "401" in page_error(browser)  # the page itself needs no key
    key = browser.find_element(By.ID, "api-key")
    key.send_keys(API_KEY, Keys.TAB)  # change event: the page asks again, with the key
    WebDriverWait(browser, 30).until(lambda d: body(d) == "ready")
    set_prompt(browser, "prompt", PROMPT)
    set_settings(browser, "watch-settings", sampler="low_confidence", cache="none", max_tokens=6)
    browser.find_element(By.ID, "run").click()
    wait_finished(browser, ("watch-run",))
    page = run_result(browser, "watch-run")
    assert page["state"] == "done", page["error"]
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert page["text"] == api_text(client, PROMPT, 6, "low_confidence", "none")


@pytest.fixture(scope="module")
def spec_server():
    """tiny-ar with the DFlash drafter (speculative decoding): deltas per verification round."""
    from dllm.drafters.base import make_drafter
    from dllm.models.targets import load_target, resolve_target
    from dllm.eval.bench.serving.loopback import serve_in_thread
    from dllm.serve.http.app import create_app
    from dllm.serve.backends.speculative import SpeculativeBackend

    target, tokenizer = load_target(resolve_target("tiny-ar"))
    engine = SpeculativeBackend(target, tokenizer, drafter=make_drafter("dflash:model=tiny-ar-dflash"), name="tiny-ar")
    with serve_in_thread(create_app(engine), ready_path="/health") as live:
        yield live
    engine.close(drain=False)


def test_a_speculative_server_shows_one_box_per_round(spec_server, browser, tmp_path):
    open_page(browser, spec_server)
    root = browser.find_element(By.ID, "watch-settings")
    hidden = [name for name in ("sampler", "cache", "block_length", "options")
              if not root.find_element(By.CSS_SELECTOR, f"[data-field={name}]").is_displayed()]
    assert hidden == ["sampler", "cache", "block_length", "options"]  # a --target server takes none of them
    page = run_watch(browser, PROMPT, 12)
    screenshot(browser, tmp_path, "page-speculative.png")
    assert page["state"] == "done", page["error"]
    client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.completions.create(model="tiny-ar", prompt=PROMPT, max_tokens=12, temperature=0)
    assert page["text"] == reply.choices[0].text and page["text"].strip()
    # one box per round's delta, in order: together they are the text
    assert 1 <= len(page["cells"]) <= reply.usage.completion_tokens
    assert " ".join(page["cells"]) == " ".join(page["text"].split())
    assert page["tpf"] == f"{reply.usage.completion_tokens / len(page['cells']):.2f}" and float(page["tps"]) > 0


@pytest.fixture(scope="module")
def tuned_server():
    """A server started with a default sampler option and temperature (``dllm serve --sampler threshold
    -o threshold=0.5 --temperature 0.5``)."""
    import dllm
    from dllm.eval.bench.serving.loopback import serve_in_thread
    from dllm.serve.backends.diffusion import DiffusionBackend
    from dllm.serve.http.app import create_app
    from dllm.settings import DecodeSettings

    defaults = DecodeSettings(sampler="threshold", options=(("threshold", 0.5),), temperature=0.5, seed=3)
    engine = DiffusionBackend(dllm.load(MODEL), name=MODEL, defaults=defaults)
    with serve_in_thread(create_app(engine), ready_path="/health") as live:
        yield live
    engine.close(drain=False)


def test_the_page_starts_from_the_servers_default_options_and_temperature(tuned_server, browser):
    """The page names the sampler in each request, which drops the server's default sampler options: it
    must show and send them (and the server's temperature), so its first run is the server's default."""
    open_page(browser, tuned_server)
    root = browser.find_element(By.ID, "watch-settings")
    value = lambda name: root.find_element(By.CSS_SELECTOR, f"[data-field={name}]").get_attribute("value")
    assert (value("sampler"), value("options"), value("temperature")) == ("threshold", "threshold=0.5", "0.5")
    page = run_watch(browser, PROMPT, 8)
    assert page["state"] == "done", page["error"]
    client = openai.OpenAI(base_url=tuned_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)  # the server's defaults
    assert page["text"] == reply.choices[0].text
    assert int(page["nfe"]) == reply.choices[0].model_extra["dllm"]["nfe"]
    # the side-by-side tab's B pane picks another sampler: the default sampler's options are not its own
    assert browser.find_element(By.CSS_SELECTOR, "#b-settings [data-field=options]").get_attribute("value") == ""
