"""Rules `cloudstation check` applies to the rendered graph that are new with it (issue 21): a
container whose request exceeds its limit, which the API server refuses at apply, found by the shared
checks (cloudstation_tools/checks.py), so the policy pack's container-resources rule refuses it too."""
from __future__ import annotations

from cloudstation_tools import checks
from policy import rules
from tests.test_policy import check_resource, container, deployment


def test_a_request_above_its_limit_is_a_violation():
    spec = {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"},
                                                         "limits": {"cpu": "1", "memory": "1024Mi"}}}]}
    assert checks.resource_violations("Deployment a/web", spec) == [
        "Deployment a/web container app: cpu request 1500m is more than its limit 1 (the API server refuses it)"]
    bad = container(resources={"requests": {"cpu": "10m", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "64Mi"}})
    assert check_resource(rules.container_resources, *deployment(bad)) == [
        "Deployment apps/web container app: memory request 2Gi is more than its limit 64Mi (the API server refuses it)"]
