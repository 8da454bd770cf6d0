"""conformance.device_turns.give_back: the order in which a vendor-mode test's turn gives its devices back
(pure logic over a recording stand-in for the API; the real outcome is checked by the vendor-mode runs)."""

from __future__ import annotations

from types import SimpleNamespace

from conformance import device_turns


class _Cluster:
    """Pods and claims of one namespace. Deleting a bound pod frees its devices at once, and a waiting pod
    that still exists then is given them (what kube-scheduler does when it sees the devices freed)."""

    def __init__(self, pods: dict[str, str | None]):
        self.pods = dict(pods)  # name -> node (None: waiting)
        self.scheduled_while_cleaning: list[str] = []
        self.core = SimpleNamespace(list_namespaced_pod=self._list_pods, delete_namespaced_pod=self._delete_pod)
        self.resource = SimpleNamespace(list_namespaced_resource_claim=lambda ns: SimpleNamespace(items=[]),
                                        delete_namespaced_resource_claim=lambda name, ns: None)
        self.scheduling = SimpleNamespace(list_namespaced_pod_group=lambda ns: SimpleNamespace(items=[]))

    def _list_pods(self, namespace):
        return SimpleNamespace(items=[SimpleNamespace(metadata=SimpleNamespace(name=n, uid=n),
                                                      spec=SimpleNamespace(node_name=node))
                                      for n, node in self.pods.items()])

    def _delete_pod(self, name, namespace):
        node = self.pods.pop(name)
        if node is not None:
            for other, where in self.pods.items():
                if where is None:
                    self.scheduled_while_cleaning.append(other)


def test_waiting_pods_are_gone_before_a_bound_pod_frees_its_devices():
    # names sort bound before waiting, as in test_containers_and_init_containers_get_their_own_requests
    cluster = _Cluster({"multi": "node-0", "one-more": "node-0", "two-more": None})
    device_turns.give_back(cluster, "ns", timeout=5)  # type: ignore[arg-type]
    assert cluster.pods == {}
    assert cluster.scheduled_while_cleaning == []


def test_the_stand_in_does_show_the_race_when_bound_pods_go_first():
    cluster = _Cluster({"multi": "node-0", "two-more": None})
    cluster.core.delete_namespaced_pod("multi", "ns")
    assert cluster.scheduled_while_cleaning == ["two-more"]
