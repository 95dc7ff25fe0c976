"""The chat page (`kestrel serve` at /) and the live metrics page (/metrics/live) in a real
browser: headless Chromium driven by selenium, against `kestrel serve` with the default model.

A missing browser, driver or selenium fails these tests with the command that installs them
(scripts/install_deps.sh); nothing is skipped."""
import json
import re
import time

import pytest

import browser_helpers
from serve_helpers import Server, wait_idle

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def browser():
    why = browser_helpers.problem()
    if why:
        pytest.fail(why, pytrace=False)
    driver = browser_helpers.start_browser()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def wait_for(condition, timeout=60, what="condition"):
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def by_id(driver, element_id):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def open_chat(driver, server, model_shown=True):
    """Opens the chat page with empty storage (no conversations, default settings)."""
    driver.get(server.base + "/")
    driver.execute_script("localStorage.clear()")
    driver.refresh()
    if model_shown:
        wait_for(lambda: by_id(driver, "model").text not in ("", "connecting…"), 30, "/props")
        assert by_id(driver, "model").text == "gemma-3-270m-q4_k_m"


def set_fields(driver, **values):
    """Sets settings fields by id (underscores for dashes) as a user would, firing change."""
    for key, value in values.items():
        driver.execute_script(
            "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
            "e.dispatchEvent(new Event('change', {bubbles: true}));", key.replace("_", "-"), str(value))


def type_and_enter(driver, text):
    from selenium.webdriver.common.keys import Keys
    box = by_id(driver, "message")
    box.click()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def last_answer(driver):
    """(content text, stats text, pending) of the last answer on the page."""
    return driver.execute_script("""
        const all = document.querySelectorAll('.msg.assistant');
        const a = all[all.length - 1];
        if (!a) return null;
        const stats = a.querySelector('.stats');
        return [a.querySelector('.content').textContent, stats ? stats.textContent : '',
                a.classList.contains('pending')];""")


def answer_done(driver):
    return not by_id(driver, "send").get_attribute("disabled") and by_id(driver, "stop").get_attribute("disabled")


def record_answer_growth(driver):
    """From now on the page records the last answer's text length at every DOM change."""
    driver.execute_script("""
        window.__lengths = [];
        new MutationObserver(() => {
          const all = document.querySelectorAll('.msg.assistant');
          if (all.length) window.__lengths.push(all[all.length - 1].querySelector('.content').textContent.length);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});""")


def test_pages_load_without_console_errors(browser, server):
    open_chat(browser, server)
    assert browser.title == "Kestrel chat"
    assert "FlashHead off" in by_id(browser, "badges").text
    assert "ctx 4,096" in by_id(browser, "badges").text
    assert browser_helpers.severe_console_entries(browser) == []

    browser.get(server.base + "/metrics/live")
    assert browser.title == "Kestrel live metrics"
    # Rates need two polls, a second apart.
    wait_for(lambda: "tok/s" in by_id(browser, "m-gen-rate").text, 10, "the live metrics")
    assert re.fullmatch(r"[\d,]+ MiB", by_id(browser, "m-rss").text), by_id(browser, "m-rss").text
    assert by_id(browser, "m-running").text == "0 / 4"
    assert browser_helpers.severe_console_entries(browser) == []


def test_controls_are_labelled_for_screen_readers(browser, server):
    open_chat(browser, server)
    unnamed = browser.execute_script("""
        const missing = [];
        for (const e of document.querySelectorAll('input, textarea, select, button')) {
          const label = e.id && document.querySelector(`label[for="${e.id}"]`);
          const name = e.getAttribute('aria-label') || e.getAttribute('aria-labelledby') ||
                       (label && label.textContent.trim()) || (e.tagName === 'BUTTON' && e.textContent.trim());
          if (!name) missing.push(e.outerHTML);
        }
        return missing;""")
    assert unnamed == []
    messages = by_id(browser, "messages")
    assert messages.get_attribute("role") == "log" and messages.get_attribute("aria-live") == "polite"
    assert by_id(browser, "stop").get_attribute("aria-keyshortcuts") == "Escape"
    assert browser.execute_script("return document.documentElement.lang") == "en"
    # The settings button says whether its panel is open.
    toggle = by_id(browser, "settings-toggle")
    assert toggle.get_attribute("aria-expanded") == "false"
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true" and by_id(browser, "settings").is_displayed()
    # Escape closes it from the keyboard and gives the focus back to its button.
    from selenium.webdriver.common.keys import Keys
    by_id(browser, "temperature").send_keys(Keys.ESCAPE)
    assert toggle.get_attribute("aria-expanded") == "false" and not by_id(browser, "settings").is_displayed()
    assert browser.switch_to.active_element == toggle


def test_extra_fields_cannot_take_over_the_request(browser, server):
    open_chat(browser, server)
    set_fields(browser, extra='{"stream": false}')
    type_and_enter(browser, "Hello")
    wait_for(lambda: "set by the page" in by_id(browser, "settings-error").text, 10, "the settings error")
    set_fields(browser, extra="")


def test_enter_sends_and_the_reply_streams(browser, server):
    open_chat(browser, server)
    set_fields(browser, max_tokens=48, temperature=0, extra='{"ignore_eos": true}')
    record_answer_growth(browser)
    type_and_enter(browser, "Write a short story about a kestrel.")
    assert by_id(browser, "message").get_attribute("value") == ""  # Enter sent it
    assert by_id(browser, "stop").is_enabled()
    wait_for(lambda: answer_done(browser), 120, "the answer")
    content, stats, pending = last_answer(browser)
    lengths = browser.execute_script("return window.__lengths")
    # Streamed: the text grew through several lengths before it ended.
    assert len(set(n for n in lengths if n > 0)) >= 3, lengths
    assert lengths == sorted(lengths), lengths
    assert content and not pending
    # (a request alone drafts by default: docs/speculative.md)
    assert re.search(r"TTFT [\d,]+ ms · [\d.,]+ tok/s · 48 tokens · 0 cached · FlashHead off · "
                     r"(\d+ drafted / \d+ accepted · )?cut at max tokens", stats), stats

    # A follow-up in the same conversation: the server's prompt cache serves the first turn.
    type_and_enter(browser, "And then?")
    wait_for(lambda: answer_done(browser), 120, "the second answer")
    _, stats, _ = last_answer(browser)
    cached = int(re.search(r"([\d,]+) cached", stats).group(1).replace(",", ""))
    assert cached > 10, stats

    # Kept in the browser's storage: after a reload the conversation is listed and shown.
    browser.refresh()
    wait_for(lambda: len(browser.find_elements("css selector", ".msg")) == 4, 10, "the stored conversation")
    titles = [e.text for e in browser.find_elements("css selector", ".conversations .open")]
    assert titles == ["Write a short story about a kestrel."]
    assert browser_helpers.severe_console_entries(browser) == []


def test_stop_cancels_the_generation(browser, server):
    from selenium.webdriver.common.keys import Keys
    open_chat(browser, server)
    set_fields(browser, max_tokens=3000, extra='{"ignore_eos": true}')
    for n, how in enumerate(("button", "escape"), start=1):
        cancelled = server.metric("kestrel_requests_cancelled_total")
        type_and_enter(browser, "Tell me a very long story.")
        wait_for(lambda: (last_answer(browser) or ["", "", True])[0], 60, "the first streamed text")
        if how == "button":
            by_id(browser, "stop").click()
        else:
            by_id(browser, "message").send_keys(Keys.ESCAPE)
        wait_for(lambda: answer_done(browser), 10, "the page to stop")
        content, stats, _ = last_answer(browser)
        assert "stopped" in stats and content
        # Server side, the generation ends: counted as cancelled, nothing runs, no tokens follow.
        wait_for(lambda: server.metric("kestrel_requests_cancelled_total") == cancelled + 1, 10,
                 f"the server to cancel ({how})")
        wait_idle(server, 10)
        generated = server.metric("kestrel_generation_tokens_total")
        time.sleep(0.5)
        assert server.metric("kestrel_generation_tokens_total") == generated

    # The next request is served at once.
    set_fields(browser, max_tokens=8, extra="")
    started = time.time()
    type_and_enter(browser, "Hello")
    wait_for(lambda: answer_done(browser), 30, "the answer after a stop")
    _, stats, _ = last_answer(browser)
    assert re.search(r"TTFT [\d,]+ ms · .*\b[1-8] tokens?", stats), stats  # answered, no error
    assert time.time() - started < 30
    # The stopped answers stay in the conversation, marked as stopped.
    assert len(browser.find_elements("css selector", ".msg.assistant")) == 3
    assert browser_helpers.severe_console_entries(browser) == []


# A stream as a Gemma 4 server sends it with thinking on and a tool offered: what the page
# shows is checked without a Gemma 4 model (none runs in Kestrel yet).
FAKE_STREAM = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": "The user wants the weather; "}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": "call the tool."}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "Checking **Paris** <img src=x id=injected>"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                              "prompt_tokens_details": {"cached_tokens": 5},
                              "completion_tokens_details": {"accepted_prediction_tokens": 7,
                                                            "rejected_prediction_tokens": 2}}},
]


def test_thinking_and_tool_calls_are_shown_apart(browser, server):
    open_chat(browser, server)
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in FAKE_STREAM) + ": heartbeat\n\ndata: [DONE]\n\n"
    browser.execute_script("""
        const body = arguments[0], real = window.fetch;
        window.__sent = null;
        window.fetch = (url, init) => {
          if (url !== '/v1/chat/completions') return real(url, init);
          window.__sent = JSON.parse(init.body);
          const bytes = new TextEncoder().encode(body);
          const stream = new ReadableStream({start(c) {
            for (let i = 0; i < bytes.length; i += 7) c.enqueue(bytes.slice(i, i + 7));
            c.close();
          }});
          return Promise.resolve(new Response(stream, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
        };""", body)
    by_id(browser, "settings-toggle").click()
    by_id(browser, "thinking").click()
    set_fields(browser, system="You are terse.")
    type_and_enter(browser, "Weather in Paris?")
    wait_for(lambda: answer_done(browser), 10, "the answer")
    sent = browser.execute_script("return window.__sent")
    assert sent["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Weather in Paris?"}]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    answer = browser.find_elements("css selector", ".msg.assistant")[-1]
    thinking = answer.find_element("css selector", "details.thinking")
    assert thinking.find_element("css selector", "summary").text == "Thinking"
    assert thinking.get_attribute("textContent").endswith("The user wants the weather; call the tool.")
    content = answer.find_element("css selector", ".content")
    assert "The user wants" not in content.get_attribute("textContent")
    assert content.find_element("css selector", "strong").text == "Paris"
    # Markdown is rendered from escaped text: the model's HTML is shown, not run.
    assert browser.find_elements("css selector", "#injected") == []
    assert "<img src=x id=injected>" in content.text
    assert answer.find_element("css selector", ".tool-call .tool-name").text == "get_weather"
    assert json.loads(answer.find_element("css selector", ".tool-call .tool-args").text) == {"city": "Paris"}
    stats = answer.find_element("css selector", ".stats").text
    assert "12 tokens · 5 cached · FlashHead off · 9 drafted / 7 accepted" in stats, stats
    assert browser_helpers.severe_console_entries(browser) == []


def test_api_key(browser):
    from selenium.webdriver.common.keys import Keys
    keyed = Server(api_key="sesame")
    try:
        open_chat(browser, keyed, model_shown=False)
        wait_for(lambda: "API key" in by_id(browser, "server-note").text, 10, "the API key note")
        assert by_id(browser, "settings").is_displayed()
        assert browser.switch_to.active_element.get_attribute("id") == "api-key"
        browser.get_log("browser")  # the 401 of /props is logged by the browser; expected
        key = by_id(browser, "api-key")
        key.send_keys("sesame")
        key.send_keys(Keys.TAB)  # change: saved, /props asked again
        wait_for(lambda: by_id(browser, "model").text == "gemma-3-270m-q4_k_m", 10, "/props with the key")
        set_fields(browser, max_tokens=4)
        type_and_enter(browser, "Hi")
        wait_for(lambda: answer_done(browser), 30, "the answer")
        _, stats, _ = last_answer(browser)
        assert "4 tokens" in stats, stats
        assert browser.execute_script("return JSON.parse(localStorage.getItem('kestrel.apiKey.v1'))") == "sesame"
        assert browser_helpers.severe_console_entries(browser) == []
    finally:
        keyed.stop()


def test_static_files_are_served_with_their_types(server):
    import http.client
    for path, ctype in (("/", "text/html"), ("/ui/chat.js", "text/javascript"), ("/ui/style.css", "text/css"),
                        ("/ui/favicon.svg", "image/svg+xml"), ("/metrics/live", "text/html")):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith(ctype), path
        assert "script-src 'self'" in resp.getheader("Content-Security-Policy")
        assert body
        conn.close()
    status, body = server.request("GET", "/ui/nothing.js")
    assert status == 404 and "error" in body
    status, props = server.request("GET", "/props")
    assert status == 200
    assert props["model"] == "gemma-3-270m-q4_k_m" and props["flashhead"] == {"enabled": False}
    assert props["n_ctx"] == 4096 and props["parallel"] == 4 and props["chat_format"] == "gemma3"
    assert props["speculative"] == {"draft": "auto", "draft_max": 6, "draft_accept": "exact", "mtp_assistant": None}
