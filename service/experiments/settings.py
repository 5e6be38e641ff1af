"""The service's settings for recording jobs in MLflow (``c.ExperimentSettings.<name>``)."""

from __future__ import annotations

import os

from traitlets import Int, Unicode, default
from traitlets.config import Configurable

from .recorder import RunRecorder


class ExperimentSettings(Configurable):
    mlflow_url = Unicode(
        help="""The MLflow service behind the hub as the gpulab service reaches it; each
        ended %%train_distributed job is written there as a run of its user. `gpulab up`
        sets it (the hub's `mlflow` service); empty: jobs are not recorded in MLflow.

        c.ExperimentSettings.mlflow_url = "http://mlflow.gpulab.svc:10102/services/mlflow"
        """,
    ).tag(config=True)

    @default("mlflow_url")
    def _mlflow_url(self):
        return os.environ.get("GPULAB_MLFLOW_URL", "")

    mlflow_model_max_mib = Int(
        200,
        help="""A job's --out model (its state dict) up to this size is logged as the
        run's `model/state_dict.pt` artifact; a larger one is not copied into MLflow.

        c.ExperimentSettings.mlflow_model_max_mib = 1024
        """,
    ).tag(config=True)

    def make_run_recorder(self) -> RunRecorder | None:
        """The recorder of jobs' runs, or None where no MLflow service is set."""
        if not self.mlflow_url:
            return None
        return RunRecorder(
            self.mlflow_url, os.environ["JUPYTERHUB_API_TOKEN"], self.mlflow_model_max_mib << 20
        )
