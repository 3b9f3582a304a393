"""RecordingMonitor answers a registration with only the state the mocks changed or added, outside
preview (cloudstation_tools/mocks.py): the SDK then takes every input left out as its output
(pulumi 3.272.0 sdk/python/lib/pulumi/runtime/rpc.py `resolve_outputs`). Here every stack file is
rendered both ways, and everything the program produced must be the same: every registration (type,
name, parent, provider, dependencies, options, inputs, which hold other resources' outputs), the
stack outputs, the made-up values and the reads."""
from __future__ import annotations

import pytest
from cloudstation_tools import render
from cloudstation_tools.mocks import RecordingMonitor
from tests import stacks
from tests.conftest import STACKS


def everything(rendered: render.Rendered) -> dict:
    return {
        # The order of a registration's dependencies is the order its awaits finished in (render sorts them).
        "registrations": [{**r.__dict__, "dependencies": sorted(r.dependencies)} for r in rendered.registrations],
        "outputs": rendered.outputs,
        "made_up": rendered.made_up,
        "reads": rendered.reads,
    }


def echoed(stack: str, preview: bool = False) -> render.Rendered:
    """`stack` rendered with the whole state echoed (prod from its promoted file, as conftest's)."""
    RecordingMonitor.echo_inputs = True
    try:
        return stacks.render(stack, preview=preview, stack_file=stacks.read(stack) if stack == stacks.PROD else None)
    finally:
        RecordingMonitor.echo_inputs = False


@pytest.mark.parametrize("stack", STACKS)
def test_answering_with_the_changes_only_yields_what_echoing_every_input_yields(stack, rendered_stacks):
    assert everything(rendered_stacks[stack]) == everything(echoed(stack))


def test_a_preview_is_the_same_both_ways():
    stack = stacks.SOURCE
    assert everything(stacks.render(stack, preview=True)) == everything(echoed(stack, preview=True))


@pytest.mark.parametrize("preview", [False, True])
def test_the_answer_leaves_out_exactly_the_echoed_inputs_outside_preview(preview):
    """The monitor's answer: outside preview the mocks' additions only (a generated password's
    result), nothing the inputs already said; in preview, where the SDK would read a left-out input
    as unknown (`resolve_outputs` fills inputs in only `if not settings.is_dry_run()`), the whole state."""
    stack = stacks.SOURCE
    answered: list[dict] = []
    original = RecordingMonitor.RegisterResource

    def spy(self, request):
        response = original(self, request)
        answered.append({"type": request.type, "inputs": set(request.object.fields),
                         "answer": set(response.object.fields) if request.type != "pulumi:pulumi:Stack" else None})
        return response

    RecordingMonitor.RegisterResource = spy
    try:
        stacks.render(stack, preview=preview)
    finally:
        RecordingMonitor.RegisterResource = original
    objects = [a for a in answered if a["type"].startswith("kubernetes:") and a["inputs"]]
    passwords = [a for a in answered if a["type"] == "random:index/randomPassword:RandomPassword"]
    assert objects and passwords
    if preview:
        assert all(a["answer"] == a["inputs"] for a in objects)
        assert all(a["answer"] > a["inputs"] for a in passwords)
    else:
        assert all(a["answer"] == set() for a in objects), "Kubernetes objects: the mocks add nothing"
        assert all(a["answer"] and not a["answer"] & a["inputs"] for a in passwords)


def test_urns_carry_the_whole_parent_type_chain_as_the_engine_builds_them(rendered_stacks):
    """pulumi/pulumi sdk/go/common/resource/urn/urn.go `New`: the parent's qualified type (its whole
    `$`-joined chain, none for the root stack) before the type. The SDK's MockMonitor keeps only the
    parent's own type; the real engine's URN of this StatefulSet (seen in the end-to-end tier) is:"""
    urns = {r.urn for r in rendered_stacks["test"].registrations}
    assert ("urn:pulumi:test::cloudstation::cloudstation:cloudstate:ProjectEnvironment$cloudstation:cloudstate:Store"
            "$cloudstation:stores:Postgres$kubernetes:apps/v1:StatefulSet::project-state-postgres-statefulset") in urns
    assert "urn:pulumi:test::cloudstation::pulumi:providers:kubernetes::kubernetes" in urns
