"""How the browser tests start Chromium, and how long their expectations wait."""

from playwright.sync_api import expect

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


# Playwright's ``expect`` waits 5 s unless told, whatever a page's set_default_timeout
# says; what the tests expect often waits on a hub, a server and the service behind it
# on a loaded 2-core machine. Every browser test imports this module.
expect.set_options(timeout=60_000)
