"""Cluster definitions shipped with dra-harness: the feature-gate matrix and example clusters."""

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
FEATURE_GATES_DIR = DIRECTORY / "feature-gates"
