"""The database-backed adaptors of the agents: where learned filter rules and suggested
diagnosis rules are stored, and the agents built from the settings."""
