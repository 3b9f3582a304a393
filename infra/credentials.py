"""Credentials in plain text: when a name or a value is one. One definition for the stack config (Armada's
free-form `extra` maps, components/armada/settings.py), the checks of the rendered graph and the policy
pack (cloudstation_tools/checks.py: ConfigMaps, environment variables, plain stack config). Standard
library only, so the pack can import it without the program's dependencies.

Names are compared without case and separators, so `DB_PASSWORD`, `dbPassword`, `db-password` and
`DbPassword` are alike (Viper, which reads Armada's config, matches keys in any case), and only the last
dotted part counts. A name is a credential's when it contains one of CREDENTIAL_WORDS, unless it ends like
the name of a *reference* to a credential (a Secret's name, a key in a Secret, a file, a URL, a switch):
`passwordKey`, `existingSecret`, `jwtTokenPath`, `tokenTtl` hold no secret.
"""
from __future__ import annotations

import re
from typing import Any

CREDENTIAL_WORDS = ("password", "passwd", "passphrase", "secret", "token", "credential", "privatekey", "apikey",
                    "accesskey")
CREDENTIAL_REFERENCE_ENDINGS = ("existingsecret", "secretname", "secretref", "keyref", "keyname", "passwordkey",
                                "tokenkey", "file", "path", "url", "ttl", "enabled")
CREDENTIAL_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"          # PEM private key
    r"|\$2[abxy]?\$[0-9]{2}\$[./A-Za-z0-9]{53}"    # bcrypt hash (htpasswd)
    r"|\b[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@"  # URL with an inline password (Redis's has no user)
    r"|\bAKIA[0-9A-Z]{16}\b"                       # AWS access key id
)
"""Values that are credentials whatever their key."""
NAMED = "a credential in plain text"
LOOKS_LIKE = "holds a credential (private key, password hash or URL with a password)"


def is_credential_name(key: str) -> bool:
    normal = re.sub(r"[^a-z0-9]", "", key.rsplit(".", 1)[-1].lower())
    return any(word in normal for word in CREDENTIAL_WORDS) and not normal.endswith(CREDENTIAL_REFERENCE_ENDINGS)


def _literal(value: Any) -> bool:
    """A value that can be a credential: a non-empty string or a number, not an environment reference."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != "" \
        and not str(value).startswith(("${", "$("))


def plain_credentials(value: Any) -> list[tuple[str, str]]:
    """(path below `value`, e.g. `.postgres.connection.password` or `.addrs[0]`, NAMED or LOOKS_LIKE) of
    every credential in structured data, at any depth: a literal, or a list holding one, under a
    credential's name; a credential-looking string (CREDENTIAL_VALUE) under any name."""
    found: list[tuple[str, str]] = []

    def walk(item: Any, path: str) -> None:
        if isinstance(item, dict):
            for key, child in item.items():
                below = f"{path}.{key}"
                named = is_credential_name(str(key))
                if named and (_literal(child) or (isinstance(child, list) and any(_literal(c) for c in child))):
                    found.append((below, NAMED))
                else:
                    walk(child, below)
        elif isinstance(item, list):
            for index, child in enumerate(item):
                walk(child, f"{path}[{index}]")
        elif isinstance(item, str) and CREDENTIAL_VALUE.search(item):
            found.append((path, LOOKS_LIKE))

    walk(value, "")
    return found
