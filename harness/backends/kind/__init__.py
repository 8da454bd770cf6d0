"""`cluster up --backend kind`: real kubelets in kind's node containers, the fake driver deployed in them.

The backend itself is `harness.backends.kind.backend.KindBackend` (registered in harness.backends); the
other modules are its parts:

- backend: KindBackend (up, down, status, list, info), the cluster's state in `<state>/kind/<name>/`;
- config: the kind cluster config (nodes, labels, feature gates, CDI, the scheduler's profiles), pure;
- steps: the Plan and the exact commands `up` and `down` run, pure;
- preflight: docker, its engine, kind and kubectl checked; the Tools found;
- vendor_file: the deployed fake driver described as a vendor's, for the suite;
- host/: what the machine lacks, provided (capabilities, the harness's own dockerd and runc wrapper,
  the host network record, the offline node image and driver base).

This package imports none of its modules, so that choosing another backend loads none of them."""
