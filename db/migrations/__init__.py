"""Alembic's environment and revisions for gpulab's tables; run by :mod:`gpulab.db.migrate`."""
