"""Dialogs of JupyterLab's own that a browser test must get past."""


def dismiss_false_connection_lost(page, hub, user: str) -> None:
    """JupyterLab's hub extension asks "Server unavailable or unreachable ... restart
    it?" the first time any of its polls fails to connect; on this loaded machine one
    poll sometimes does while the server runs on, and the dialog then covers what the
    test clicks. Dismiss it, but only while the hub says ``user``'s server is ready:
    a server that really stopped still fails the test."""
    dialog = page.locator(".jp-Dialog[aria-label^='Server unavailable or unreachable']")

    def dismiss(found):
        model = hub.hub_api("GET", f"/users/{user}").json()
        assert (model.get("servers") or {}).get("", {}).get("ready"), (
            f"JupyterLab says {user}'s server is unreachable and the hub says it is not "
            f"running: {model.get('servers')}"
        )
        print(f"dismissed JupyterLab's 'Server unavailable' dialog; {user}'s server runs")
        found.get_by_role("button", name="Dismiss").click()

    page.add_locator_handler(dialog, dismiss)
