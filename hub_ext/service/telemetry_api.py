"""Routes and background work for telemetry (``/api/v1/telemetry``)."""

routes: list = []


async def start(service) -> None:
    """Called once the service listens: start the local sampler."""
