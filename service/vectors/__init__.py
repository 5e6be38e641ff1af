"""Vector collections: the engine process, its client, the collections manager."""
