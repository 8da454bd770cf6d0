"""Fake DRA drivers: hardware profiles rendered into ResourceSlices, a controller that publishes them,
and fault injection. Ships as the driver image, so it never imports `harness`."""
