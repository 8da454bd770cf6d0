"""The Kubernetes client's API groups, watches and quantity parser, for the harness, the suite and the load
tests: with harness/k8s/errors.py and client.py (Clients), the only way they reach the `kubernetes`
library (import-linter keeps it so). The names are fake_devices/kube.py's, the fake driver's own door."""

from __future__ import annotations

from kubernetes.utils import parse_quantity

from fake_devices.kube import (
    AdmissionregistrationV1Api,
    ApiClient,
    AppsV1Api,
    CoreV1Api,
    ResourceV1alpha3Api,
    ResourceV1Api,
    ResourceV1beta1Api,
    ResourceV1beta2Api,
    SchedulingV1beta1Api,
    Watch,
)

__all__ = ["AdmissionregistrationV1Api", "ApiClient", "AppsV1Api", "CoreV1Api", "ResourceV1Api", "ResourceV1alpha3Api",
           "ResourceV1beta1Api", "ResourceV1beta2Api", "SchedulingV1beta1Api", "Watch", "parse_quantity"]
