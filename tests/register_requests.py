"""RegisterResourceRequests as the engine receives them, for comparing two ways of registering the same
things byte for byte (tests/test_dynamic_resources.py, tests/test_kept_secret.py): type, name, parent,
provider, inputs (wire names, secrets), property dependencies, dependsOn, aliases, version, options,
source position and stack trace (pulumi sdk/python/lib/pulumi/runtime/resource.py `register_resource`)."""
from __future__ import annotations

import pulumi
import pulumi.runtime.settings
import pytest

from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor
from tests import stacks


class RequestMonitor(RecordingMonitor):
    """Keeps every RegisterResourceRequest and ReadResourceRequest as bytes, the set-valued fields
    sorted: the SDK builds `dependencies` (both requests) and each propertyDependencies entry from
    Python sets (pulumi 3.272.0 sdk/python/lib/pulumi/runtime/resource.py `prepare_resource`), and a
    dependency on a local component is one on each of its children, walked from
    `Resource._childResources`, a set of objects hashed by address (runtime/rpc.py
    `_add_dependency`): their order changes from run to run even through the generated classes, and
    carries no meaning."""

    def __init__(self, mocks: ProgramMocks):
        super().__init__(mocks)
        self.requests: dict[tuple[str, str, str], bytes] = {}

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        self._keep((request.type, request.name, request.parent), request)
        return response

    def ReadResource(self, request):
        # `Kind.get` of an existing object (external stores' credentials) is pulumi-kubernetes' own.
        response = super().ReadResource(request)
        self._keep(("read " + request.type, request.name, request.parent), request)
        return response

    def _keep(self, key, request):
        copy = type(request)()
        copy.CopyFrom(request)
        dependencies = sorted(copy.dependencies)
        del copy.dependencies[:]
        copy.dependencies.extend(dependencies)
        if hasattr(copy, "propertyDependencies"):  # RegisterResourceRequest only
            for entry in copy.propertyDependencies.values():
                urns = sorted(entry.urns)
                del entry.urns[:]
                entry.urns.extend(urns)
        assert key not in self.requests, key
        self.requests[key] = copy.SerializeToString(deterministic=True)



@pytest.fixture
def register():
    """`run(program)` -> {(type, name, parent): request bytes} of one mocked run of `program`."""

    def run(program) -> dict:
        mocks = ProgramMocks()
        monitor = RequestMonitor(mocks)
        pulumi.runtime.settings.ROOT.set(None)
        pulumi.runtime.set_mocks(mocks, project="requests", stack="unit", preview=False, monitor=monitor)
        pulumi.runtime.test(program)()
        return monitor.requests

    return run


def decoded(request: bytes) -> dict:
    from google.protobuf.json_format import MessageToDict
    from pulumi.runtime.proto import resource_pb2

    return MessageToDict(resource_pb2.RegisterResourceRequest.FromString(request))


RENDERS = {
    "test": lambda: stacks.render("test"),
    "prod": lambda: stacks.render("prod"),
    # external stores: their credentials are read from existing Secrets (`Secret.get`); not the cached renders
    "non-owner": lambda: stacks.render("test", stack_file=stacks.stack_file("non-owner")),
    "owner-external-cassandra": lambda: stacks.render("prod", stack_file=stacks.stack_file("owner-external-cassandra")),
}
"""The program run on the fixture stacks, and two variants that read existing Secrets."""
