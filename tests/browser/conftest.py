import pytest
from hubproc import let_accounts_reach
from playwright.sync_api import sync_playwright
from support.chromium import CHROMIUM_ARGS


# Module scope: Playwright's sync API keeps an event loop running in this
# thread while it is open, which would break later tests that use asyncio.run.
@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub (cleared when the module ends), its data dir reachable
    by users' accounts again: another pytest session on this machine resets its
    temporary root to 0700 when it starts. A module with a hub of its own (settings
    the shared one lacks) defines ``hub`` itself."""
    if plain_hub.accounts:
        let_accounts_reach(plain_hub.data_dir)
    return plain_hub
