"""Headless Chromium for the chat page's tests and screenshot: Debian's `chromium` and
`chromium-driver` (apt) driven by PyPI `selenium` (all installed by scripts/install_deps.sh).
Selenium Manager is kept offline: the browser and driver are the installed ones, nothing is
downloaded."""
import os
import shutil


def _find(env, names):
    if os.environ.get(env):
        return os.environ[env] if os.access(os.environ[env], os.X_OK) else None
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_path():
    return _find("KESTREL_CHROMIUM", ("chromium", "chromium-browser"))


def chromedriver_path():
    return _find("KESTREL_CHROMEDRIVER", ("chromedriver",))


def problem():
    """Why a browser cannot be started here, or None."""
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the PyPI package selenium (scripts/requirements.txt)")
    if not chromium_path():
        missing.append("chromium (apt)")
    if not chromedriver_path():
        missing.append("chromedriver (apt: chromium-driver)")
    if missing:
        return ("the chat page's browser tests need " + ", ".join(missing) +
                "; run scripts/install_deps.sh (or set KESTREL_CHROMIUM / KESTREL_CHROMEDRIVER)")
    return None


def start_browser(width=1200, height=900):
    """A headless Chromium with its console log readable through driver.get_log('browser')."""
    os.environ.setdefault("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--force-color-profile=srgb", "--hide-scrollbars", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=chromedriver_path()))


def severe_console_entries(driver):
    """The console's errors since the last call (the log is drained by reading it)."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
