"""The hub-managed gpulab service (REST API, auth, database)."""
