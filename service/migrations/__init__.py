"""Alembic migrations of the Faultline schema (`service.migrate` runs them)."""
