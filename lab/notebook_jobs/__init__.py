"""Notebook jobs: Jupyter Scheduler's jobs run as gpulab jobs on GPU slices.

Jupyter Scheduler (``jupyter_scheduler``, enabled in every server gpulab spawns)
keeps its job records in the server; gpulab's parts plug into its settings
(``lab/jupyter-config/gpulab.json``):

- :mod:`.environments`: the runtime environments, whose ``compute_types`` are the
  slice sizes the user may take (``SchedulerApp.environment_manager_class``);
- :mod:`.execution`: how one notebook job runs: its parameters injected as
  papermill does (:mod:`.parameters`), the notebook and its folder shipped as a
  gpulab job through the service's ``/jobs`` with the server's token, and what
  the job's rank sent back (:mod:`.rank`) written as the job's output files
  (``Scheduler.execution_manager_class``);
- :mod:`.scheduler`: the scheduler that follows each job's state in the service
  and keeps a job definition's schedule in the service (``/schedules``), so it runs
  while the server is stopped (``SchedulerApp.scheduler_class``).

gpulab's server extension sets them as it links (:func:`use_gpulab_scheduler`): the
``*.json`` files of ``jupyter_server_config.d`` enable extensions but carry no
other settings.
"""

#: Jupyter Scheduler's settings in every server gpulab spawns.
SCHEDULER_SETTINGS = {
    "scheduler_class": "gpulab.lab.notebook_jobs.scheduler.GpulabScheduler",
    "environment_manager_class": "gpulab.lab.notebook_jobs.environments.GpulabEnvironments",
}


def use_gpulab_scheduler(config) -> None:
    """Put gpulab's parts in Jupyter Scheduler's settings (``config.SchedulerApp``),
    leaving any a site set (``c.SchedulerApp.scheduler_class = ...``)."""
    for name, value in SCHEDULER_SETTINGS.items():
        if name not in config.SchedulerApp:
            config.SchedulerApp[name] = value
