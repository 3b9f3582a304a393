"""Bounds on what the command line and the build provider wait for and read: an overall deadline and
response size caps. In components/ because components/registry_api.py (shared by both) uses them.

`python -m infra promote` and `rollback` talk to registries, ECR, S3 and the Pulumi CLI; none of
them may hang the run or fill its memory. Every request's timeout is the smaller of its own and
what is left of the run's deadline, and every answer, status line and headers included, is read in
chunks against a size cap and the deadline (a server dripping bytes cannot hold the run past it:
components/transport.py `response_class`).
"""
from __future__ import annotations

import math
import time
from typing import Optional

MAX_MANIFEST_BYTES = 4 << 20
"""An image manifest or index (distribution's own limit for a manifest PUT is 4 MiB)."""
MAX_SMALL_ANSWER_BYTES = 1 << 20
"""Anything else a registry or API answers: token responses, error bodies, queue documents."""
MAX_CHECKPOINT_BYTES = 512 << 20
"""A Pulumi checkpoint (state file) of the test stack."""
DEFAULT_DEADLINE_SECONDS = 300.0
"""A promotion or rollback as a whole (`--timeout`)."""


class DeadlineExceeded(Exception):
    """The run's deadline passed; str() says what was being waited for."""


class Deadline:
    """A point in time after which nothing more is waited for (None: no deadline); `source` names
    the setting it comes from in the error."""

    def __init__(self, seconds: Optional[float] = DEFAULT_DEADLINE_SECONDS, source: str = "--timeout"):
        self.seconds = seconds
        self.source = source
        self.at = math.inf if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def exceeded(self, what: str) -> DeadlineExceeded:
        return DeadlineExceeded(f"{what}: gave up at the {self.seconds:g} s deadline ({self.source})")

    def check(self, what: str) -> None:
        if self.remaining() <= 0:
            raise self.exceeded(what)

    def within(self, seconds: Optional[float], source: str) -> "Deadline":
        """This deadline, or one `seconds` from now (named `source`) when that comes first."""
        if seconds is None:
            return self
        own = Deadline(seconds, source)
        return own if own.at < self.at else self

    def timeout(self, own: float, what: str) -> float:
        """The timeout for one wait: `own`, or less if the deadline comes first."""
        self.check(what)
        return min(own, self.remaining())
