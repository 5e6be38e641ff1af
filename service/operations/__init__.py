"""Running the platform: alerts (rules, facts, actions, the webhook), the audit trail,
self-healing of faulty GPUs, the ledger guard, the reconciler of servers against the
hub, and the operations metrics."""
