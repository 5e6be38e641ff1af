"""Routes and background work for training jobs (``/api/v1/jobs``)."""

routes: list = []


async def start(service) -> None:
    """Called once the service listens: re-attach to running jobs."""
