"""What a command does from start to end: `run` / `conformance run` (`runner`: a cluster from the
chosen backend, the suite in pytest, the report), `load run` / `load sweep` (`load_runner`, and
`load_guest` for a cluster the user gives), `bench upstream` (`upstream_perf`), and the report built
from the suite's results (`report`). Jobs use backends through the registry; nothing but the command
line imports them."""
