"""Persistence: the database, its models and migrations, jobs and rules, incidents."""
