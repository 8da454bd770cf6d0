"""The one place that talks to the Kubernetes API (through the official `kubernetes` client)."""
