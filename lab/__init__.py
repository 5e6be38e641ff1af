"""gpulab inside JupyterLab: a prebuilt labextension and the server extension it calls.

The labextension (``lab/js``, built into ``lab/labextension``) shows the server's
slice in the status bar and the user's jobs, endpoints, alerts and usage in a side
panel. It never holds a token: it calls this server (jupyter_server's own login and
XSRF checks), whose handlers (:mod:`gpulab.lab.handlers`) call the gpulab service
with the server's hub token, exactly as ``gpulab.client`` does in a kernel.

Enabled in a venv by ``etc/jupyter/jupyter_server_config.d/gpulab.json``
(``make`` installs it; a wheel ships it as data files).
"""

from __future__ import annotations


def _jupyter_server_extension_points():
    return [{"module": "gpulab.lab"}]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "@gpulab/lab"}]


def _link_jupyter_server_extension(serverapp):
    # Before Jupyter Scheduler links (extensions link in name order) and reads the
    # server's config: gpulab's scheduler and environments unless a site set its own.
    from .notebook_jobs import use_gpulab_scheduler

    use_gpulab_scheduler(serverapp.config)


def _load_jupyter_server_extension(serverapp):
    from .handlers import setup_handlers

    setup_handlers(serverapp)
