"""`python -m harness.cli ...`: the same as the `dra-harness` command."""

from harness.cli.main import main

main()
