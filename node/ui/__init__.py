"""The web dashboard every node serves at /ui/: read-only, live over one event stream per page,
behind a read token exchanged for a session cookie."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.ui.access import (
        CONTENT_SECURITY_POLICY,
        COOKIE_NAME,
        EVENTS_PATH,
        LOGIN_PATH,
        UiAccess,
        cookie_name,
        load_ui_token,
    )
    from node.ui.component import Dashboard
    from node.ui.events import EventHub
    from node.ui.topics import UiSources
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.ui.access": (
                "CONTENT_SECURITY_POLICY COOKIE_NAME EVENTS_PATH LOGIN_PATH UiAccess cookie_name "
                "load_ui_token"
            ),
            "node.ui.component": "Dashboard",
            "node.ui.events": "EventHub",
            "node.ui.topics": "UiSources",
        },
    )

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "COOKIE_NAME",
    "EVENTS_PATH",
    "LOGIN_PATH",
    "Dashboard",
    "EventHub",
    "UiAccess",
    "UiSources",
    "cookie_name",
    "load_ui_token",
]
