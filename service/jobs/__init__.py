"""Training jobs: the job manager (queue, ledger and backends composed), the site's
pools and where a job goes, the job backends each pool runs, preemption, and the
per-account CPU quota a local job is held to."""
