"""URL helpers shared by configuration, adapters and the CLI."""

from __future__ import annotations

import re

MASK = "***"
# scheme://user[:password]@ where the password may hold anything but '@' (even '/')
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:]*)(?P<pw>:[^@]*)?@")


def redact_url(url: str) -> str:
    """The URL with its password masked, fit for logs and error messages.

    ``scheme://user:pass@host`` becomes ``scheme://user:***@host``; userinfo without a colon
    is masked whole, since some clients read a bare ``secret@host`` as the password.
    """
    match = _USERINFO.match(url)
    if match is None:
        return url
    masked = f"{match['user']}:{MASK}" if match["pw"] is not None else MASK
    return f"{match['scheme']}{masked}@{url[match.end() :]}"
