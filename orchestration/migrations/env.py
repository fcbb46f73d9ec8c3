"""Alembic environment: the URL comes from the config that ``orchestration.core.db`` builds."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

# Modules whose tables are part of the schema besides ``models`` (for autogenerate).
from orchestration.core.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
