"""The CloudStation policy pack: `pulumi preview --policy-pack policy` (rules in rules.py).

Constructing the PolicyPack starts the analyzer's gRPC server, so only the Pulumi CLI runs this
file; the tests call the rules directly (tests/test_policy.py).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from rules import POLICIES  # noqa: E402

PolicyPack(name="cloudstation", policies=POLICIES, enforcement_level=EnforcementLevel.MANDATORY)
