"""Experiments in MLflow: an MLflow tracking server behind the hub at ``/services/mlflow``.

The hub starts ``python -m gpulab.service.experiments`` as a service of its own. It
runs MLflow's server (from PyPI) on a Unix socket only it can reach
(:mod:`.tracking_server`), and in front of it an authenticating proxy of gpulab's
(:mod:`.proxy`): the hub token is the bearer, each experiment is owned by the user who
created it (a tag the proxy sets, :mod:`.ownership`), and every route of MLflow's REST
API that the proxy lets through is one whose experiment or run it can check
(:mod:`.surface`). The gpulab service records each ``%%train_distributed`` job as a run
in its user's name (:mod:`.recorder`).
"""
