"""How the browser tests start Chromium."""

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
