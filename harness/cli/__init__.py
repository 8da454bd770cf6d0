"""The command line `dra-harness` (`main`), with its `bench` and `profiles` command groups; run it as
`dra-harness ...` or `python -m harness.cli ...`. Nothing else imports this package."""
