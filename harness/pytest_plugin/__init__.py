"""The pytest side of the suite: the plugin (`plugin`: options, fixtures, the result recorder; loaded
by the `pytest11` entry point or `-p harness.pytest_plugin.plugin`), the run's one shared cluster
(`session`), failure diagnostics (`diagnostics`) and the record of which drivers' devices each test
was allocated (`allocations`). The suite (conformance/) uses its fixtures; it never imports a job."""
