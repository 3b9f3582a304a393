"""A namespace created by the platform, labelled for Pod Security admission, that denies all
traffic except DNS until the components in it allow their own flows (components/network.py)."""
from __future__ import annotations

from typing import Literal, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import network
from components.k8s import PART_OF
from components.model import ConfigModel, DnsLabel
from components.component import Component


class NamespaceArgs(ConfigModel):
    name: DnsLabel
    pod_security: Literal["restricted", "baseline"] = "restricted"
    """Pod Security Standard enforced by admission; violations of "restricted" are always warned."""
    labels: dict[str, str] = {}
    keep_on_delete: bool = False
    """True for a namespace that holds data (a store's or the registry's volume): deleting a
    namespace deletes everything in it, so Pulumi leaves it in the cluster when the stack drops it
    (`retainOnDelete`; docs/cloudstate.md, "What is kept")."""


def namespace_metadata(args: NamespaceArgs) -> dict:
    return {
        "name": args.name,
        "labels": {
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": "pulumi",
            "pod-security.kubernetes.io/enforce": args.pod_security,
            "pod-security.kubernetes.io/warn": "restricted",
            "pod-security.kubernetes.io/audit": "restricted",
            **args.labels,
        },
    }


class Namespace(Component):
    """Outputs: `name` (the namespace's name, resolved once it exists). Children: the namespace
    and its `default-deny` and `allow-dns` NetworkPolicies."""

    def __init__(self, name: str, args: NamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:platform:Namespace", name, None, opts)
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=namespace_metadata(args), opts=self.child_opts(retain_on_delete=args.keep_on_delete)
        )
        self.resource = namespace
        self.name: pulumi.Output[str] = namespace.metadata.name
        # Reading the name from the namespace makes the policies wait for it.
        self.policies: list[pulumi.Resource] = [
            k8s.networking.v1.NetworkPolicy(
                f"{name}-default-deny", **network.default_deny(self.name), opts=self.child_opts()
            ),
            k8s.networking.v1.NetworkPolicy(f"{name}-allow-dns", **network.allow_dns(self.name), opts=self.child_opts()),
        ]
        self.register_outputs({"name": self.name})
