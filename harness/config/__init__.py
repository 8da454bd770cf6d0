"""User-facing configuration: the feature-gate matrix, cluster definitions, flag parsing."""
