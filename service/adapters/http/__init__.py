"""The HTTP face of the service: health, readiness, metrics and Sedna's worker report endpoint.

- `routes`: what each request is answered (and what is refused before a callback sees it).
- `server`: `HttpServer`, waitress with a deadline per request and a cap on connections.
"""

from service.adapters.http.server import HttpServer

__all__ = ["HttpServer"]
