"""Alembic's entry into gpulab's schema.

:func:`gpulab.db.migrate.upgrade` runs it on a connection that already holds
the write lock, inside the transaction it will commit; so Alembic adds no
transaction of its own and takes no connection of its own.
"""

from alembic import context

from gpulab.db.migrate import VERSION_TABLE, target_metadata

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "gpulab's migrations run through `python -m gpulab.db.migrate` "
        "(or the service's start), which holds the database's write lock"
    )

context.configure(
    connection=connection,
    target_metadata=target_metadata(),
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER most things; batch mode copies the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
