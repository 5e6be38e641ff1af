"""FractionalLocalSpawner: a local JupyterLab process held to a GPU slice.

Use it with ``c.JupyterHub.spawner_class = "gpulab-local"``. On start it asks
the gpulab service for a slice (``user_options = {"gpu_milli": 250}``), then
starts the server with the slice in its environment (see
:mod:`.enforcement`). Stop, a failed start and idle culling (which stops the
server) give the slice back.

Servers run as the hub's own system user, like JupyterHub's
``SimpleLocalProcessSpawner``: fine for one person's workstation or a trusted
group; give users separate system accounts or Kubernetes pods for isolation
between them.
"""

from __future__ import annotations

import json
import os
import sys

from jupyterhub.spawner import SimpleLocalProcessSpawner
from tornado import web
from traitlets import Unicode, default

from gpulab.scheduler.slices import SliceError, parse_gpu_milli

from .enforcement import mps_pipe_directory, slice_env, strip_enforcement_vars
from .form import render_form
from .service_traits import GpuLabServiceMixin


def _bad_options(message: str) -> web.HTTPError:
    return web.HTTPError(400, f"invalid user_options: {message}")


def parse_user_options(options: object) -> int:
    """``{"gpu_milli": N}`` -> N; anything else is a 400 that says what is wrong."""
    if options is None:
        return 0
    if not isinstance(options, dict):
        raise _bad_options('expected a JSON object like {"gpu_milli": 250}')
    unknown = set(options) - {"gpu_milli"}
    if unknown:
        raise _bad_options(f"unknown option(s) {', '.join(sorted(map(str, unknown)))}; "
                           f'the only option is "gpu_milli" (e.g. {{"gpu_milli": 250}})')
    try:
        return parse_gpu_milli(options.get("gpu_milli", 0))
    except SliceError as e:
        raise _bad_options(str(e)) from None


class FractionalLocalSpawner(GpuLabServiceMixin, SimpleLocalProcessSpawner):
    kernel_dir = Unicode(
        help="""Folder for the kernelspec that loads gpulab's magics in every kernel;
        put first on the servers' JUPYTER_PATH.

        c.FractionalLocalSpawner.kernel_dir = "/srv/gpulab/jupyter"
        """,
    ).tag(config=True)

    @default("kernel_dir")
    def _kernel_dir(self):
        return os.path.join(os.environ.get("GPULAB_DATA_DIR", os.path.abspath(".gpulab")),
                            "jupyter")

    @default("options_form")
    def _options_form_default(self):
        return self._render_options_form

    async def _render_options_form(self, spawner):
        availability = await self._client().request(
            "GET", "/availability", query={"user": self.user.name})
        return render_form(availability)

    def options_from_form(self, formdata):
        values = formdata.get("gpu_milli") or ["0"]
        try:
            return {"gpu_milli": parse_gpu_milli(values[0])}
        except SliceError as e:
            raise _bad_options(str(e)) from None

    def _write_kernelspec(self) -> None:
        # A python3 kernelspec that loads gpulab's magics; first on JUPYTER_PATH,
        # it shadows the default one in gpulab's servers only.
        path = os.path.join(self.kernel_dir, "kernels", "python3")
        os.makedirs(path, exist_ok=True)
        spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                         "--ext=gpulab.magics"],
                "display_name": "Python 3 (gpulab)", "language": "python",
                "metadata": {"debugger": True}}
        tmp = os.path.join(path, f"kernel.json.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(spec, f, indent=1)
        os.replace(tmp, os.path.join(path, "kernel.json"))

    async def start(self):
        milli = parse_user_options(self.user_options)
        allocations = await self._client().request("POST", "/allocations", body={
            "user": self.user.name, "owner_kind": "server", "owner": self._owner,
            "gpu_milli": milli})
        self._slice = slice_env(allocations, any(a.get("simulated") for a in allocations),
                                mps_pipe_directory())
        self.log.info("%s holds %s milli-GPU on %s", self._owner, milli,
                      self._slice.get("GPULAB_GPU_UUID") or "no GPU")
        try:
            self._write_kernelspec()
            return await super().start()
        except BaseException:
            await self._release()
            raise

    def get_env(self):
        env = strip_enforcement_vars(super().get_env())
        env.update(getattr(self, "_slice", {}))
        env["GPULAB_API_URL"] = self.gpulab_public_api_url or self.gpulab_api_url
        paths = [self.kernel_dir] + [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        env["JUPYTER_PATH"] = os.pathsep.join(paths)
        return env
