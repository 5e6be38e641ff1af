import pytest
from playwright.sync_api import sync_playwright

# Chromium from Debian (apt), driven by Playwright; the flags keep it off the
# network it cannot reach here and let it run as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Module scope: Playwright's sync API keeps an event loop running in this
# thread while it is open, which would break later tests that use asyncio.run.
@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield b
        b.close()
