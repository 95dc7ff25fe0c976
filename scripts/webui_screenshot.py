#!/usr/bin/env python3
"""Takes the chat page's screenshot (docs/images/chat-page.png): `kestrel serve` with the default
model, the page in headless Chromium (tests/python/browser_helpers.py), real streamed answers.

    python3 scripts/webui_screenshot.py [--out docs/images/chat-page.png]
"""
import argparse
import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import browser_helpers  # noqa: E402
from serve_helpers import Server  # noqa: E402


def wait_answer(driver, timeout=300):
    deadline = time.time() + timeout
    while driver.find_element("id", "send").get_attribute("disabled") or not driver.find_element(
            "id", "stop").get_attribute("disabled"):
        if time.time() > deadline:
            raise SystemExit("the answer did not finish")
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "images" / "chat-page.png"))
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-settings", action="store_true", help="leave the settings panel closed")
    ap.add_argument("messages", nargs="*", default=[
        "What is a kestrel?",
        "Where do kestrels live?",
    ])
    args = ap.parse_args()
    why = browser_helpers.problem()
    if why:
        raise SystemExit(why)
    server = Server()
    driver = browser_helpers.start_browser(args.width, args.height)
    try:
        # The viewport itself (--window-size counts the window's frame too).
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": args.width, "height": args.height, "deviceScaleFactor": 1, "mobile": False})
        driver.get(server.base + "/")
        driver.execute_script("localStorage.clear()")
        driver.refresh()
        for field, value in (("temperature", "0.7"), ("seed", str(args.seed)), ("max-tokens", str(args.max_tokens))):
            driver.execute_script("document.getElementById(arguments[0]).value = arguments[1]", field, value)
        for text in args.messages:
            box = driver.find_element("id", "message")
            box.send_keys(text)
            box.send_keys("\n")
            wait_answer(driver)
        if not args.no_settings:
            driver.find_element("id", "settings-toggle").click()
            driver.execute_script("document.activeElement.blur()")
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
        server.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:  # a palette PNG is a third of the size and looks the same for a flat page
        from PIL import Image
        image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        buf = io.BytesIO()
        image.save(buf, format="PNG", optimize=True)
        png = buf.getvalue()
    except ImportError:
        pass
    out.write_bytes(png)
    print(f"{out}: {len(png) // 1024} KiB")


if __name__ == "__main__":
    main()
