"""Model endpoints: the deployment manager and its versions, scaling and settings,
the endpoint router and its standby, calls and traffic, model archives and uploads,
and the Kubernetes serving settings."""
