"""gpulab.widgets: live dashboards (ipywidgets + plotly), fed by ``gpulab.client``.

from gpulab.widgets import Dashboard
Dashboard()          # or %gpulab dashboard
"""

from .dashboard import Dashboard
from .model import TelemetryModel

__all__ = ["Dashboard", "TelemetryModel"]
