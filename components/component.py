"""The base class of the project's ComponentResources."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import pulumi


class Component(pulumi.ComponentResource):
    """A ComponentResource whose children wait for what the component was told to wait for.

    Pulumi does not pass a component's `depends_on` on to its children: a component created with
    `depends_on=[namespace]` would otherwise create its Service before that namespace exists.
    Create every child with `opts=self.child_opts(...)`.
    """

    def __init__(self, type_: str, name: str, props: Optional[dict] = None, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(type_, name, props, opts)
        depends_on: Any = opts.depends_on if opts else None
        if depends_on is None:
            depends_on = []
        self._inherited_depends_on = list(depends_on) if isinstance(depends_on, (list, tuple)) else [depends_on]

    def child_opts(self, *, depends_on: Sequence[pulumi.Resource] = (), **options: Any) -> pulumi.ResourceOptions:
        """Options for a child: parented to this component, waiting for what it waits for."""
        return pulumi.ResourceOptions(parent=self, depends_on=[*self._inherited_depends_on, *depends_on], **options)
