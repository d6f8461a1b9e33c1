"""Alembic migrations of the Faultline schema (`service.store.migrate` runs them)."""
