"""JupyterLab opened in Chromium as a user would, for the lab's browser tests: logged
in through the hub, the false "connection lost" dialog dismissed, and every error
the page meets kept (console errors, uncaught exceptions, and the extension's own
failed calls with their URL: the console says only "Failed to load resource")."""

from __future__ import annotations

import re

import nbformat
from lab_dialogs import dismiss_false_connection_lost
from logins import browser_log_in, sign_up_approved


def lab_user(
    hub, user: str, password: str, notebooks: dict | None = None, gpu_milli: int | None = 250
) -> str:
    """A user as the lab's browser tests need one: signed up and approved (a browser
    logs in with ``password``), JupyterLab's news toast off (it would cover the
    screenshots), ``notebooks`` (``{"a.ipynb": [cell sources]}``) in their home and,
    unless ``gpu_milli`` is None, their server started with that slice. Their token."""
    # Signed up first: a sign-up under a name the hub already has is refused.
    sign_up_approved(hub, user, password)
    token = hub.create_user(user)
    hub.write_home_file(
        user,
        ".jupyter/lab/user-settings/@jupyterlab/apputils-extension/"
        "notification.jupyterlab-settings",
        '{"fetchNews": "false"}',
    )
    for name, cells in (notebooks or {}).items():
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (gpulab)"}
        nb.cells = [nbformat.v4.new_code_cell(s) for s in cells]
        hub.write_home_file(user, name, nbformat.writes(nb))
    if gpu_milli is not None:
        assert hub.spawn(user, {"gpu_milli": gpu_milli}).status_code in (201, 202)
        hub.wait_server(user)
    return token


def host_network(message: str) -> bool:
    """Chromium's word that this host's network interfaces changed: other tests' jobs
    make and remove network namespaces (an elastic job's at every resize) while this
    page loads. The browser retries the request; it is not the page's error."""
    return "net::ERR_NETWORK_CHANGED" in message


def watch_failed_requests(page) -> list[str]:
    """The requests ``page`` could not make (``"<reason> <url>"``), from now on."""
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(f"{r.failure} {r.url}"))
    return failed


def wait_or_reload(page, locator, failed: list[str], timeout: float = 120_000) -> None:
    """Wait for ``locator`` in JupyterLab. When a request of the page failed on the
    way (``failed``, from :func:`watch_failed_requests`: the host's network change
    cuts connections while other tests' jobs make network namespaces; one lost bundle
    and JupyterLab never starts), the lab is loaded again, as a user reloads it. With
    no failed request, a locator that never shows fails the test."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.wait_for(timeout=timeout)
    except PlaywrightTimeout:
        if not failed:
            raise
        page.reload()
        locator.wait_for(timeout=timeout)


def click_launcher_card(page, label: str, failed: list[str], timeout: float = 120_000) -> None:
    """Click the launcher's ``label`` card once JupyterLab has drawn it (see
    :func:`wait_or_reload`)."""
    card = page.locator(".jp-LauncherCard", has_text=label).first
    wait_or_reload(page, card, failed, timeout)
    card.click()


def open_lab(browser, hub, user: str, password: str, width: int = 1400, clipboard=False):
    """``(context, page, errors)`` with ``user``'s JupyterLab loading in ``page``."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    if clipboard:
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=hub.url)
    page = context.new_page()
    page.set_default_timeout(120_000)
    dismiss_false_connection_lost(page, hub, user)
    failed = watch_failed_requests(page)
    errors: list[str] = []

    def console(message) -> None:
        if message.type != "error" or host_network(message.text):
            return
        if "Failed to fetch" in message.text:
            # A fetch whose request the host's network change cut (Chromium failed it
            # with ERR_NETWORK_CHANGED just before): the browser's, not the page's.
            if any(host_network(f) for f in failed):
                return
            errors.append(f"{message.text} (requests failed so far: {failed})")
            return
        errors.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "response",
        lambda r: (
            errors.append(f"{r.status} {r.url}")
            if r.status >= 400 and "/gpulab/" in r.url and f"/user/{user}/" in r.url
            else None
        ),
    )
    browser_log_in(page, hub, user, password)
    page.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    for attempt in range(3):  # a navigation the host's network change cut: go again
        try:
            page.goto(f"{hub.url}/user/{user}/lab")
            break
        except Exception as e:
            if attempt == 2 or not host_network(str(e)):
                raise
    wait_or_reload(page, page.locator("#jp-main-dock-panel"), failed)
    return context, page, errors


def run_command(page, label: str, attempts: int = 3) -> None:
    """Run a command from JupyterLab's palette as a user does, waiting for each step
    (on a loaded machine keys typed before the palette is open are lost, and the
    palette closes again when something still loading takes the focus: then it is
    opened once more)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    search = page.locator(".lm-CommandPalette-input")
    for attempt in range(attempts):
        try:
            if not search.is_visible():
                page.keyboard.press("Control+Shift+C")
            expect(search).to_be_visible(timeout=30_000)
            search.fill(label, timeout=10_000)
            item = page.locator(".lm-CommandPalette-item", has_text=label).first
            expect(item).to_be_visible(timeout=10_000)
            item.click(timeout=10_000)
            return
        except (AssertionError, PlaywrightTimeout):
            if attempt == attempts - 1:
                raise
