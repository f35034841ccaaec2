"""What both ends of a worker's session (``RuntimeService.Connect``) agree on beyond the proto.

The server accepts a session by sending initial metadata that carries
``SESSION_ACCEPTED`` before it reads the worker's hello; a stream refused at the
door (a wrong token, a missing scope) ends without it. A worker writes its hello
only once the marker has arrived. grpc.aio's client replaces the server's status
with INTERNAL ("Failed execute_batch") when a write races a call the server has
already ended (grpc/grpc#36066), so a hello written at once would now and then
turn UNAUTHENTICATED or PERMISSION_DENIED into INTERNAL, which a worker retries
instead of reporting. Clients whose gRPC library keeps the server's status may
ignore the marker and write the hello at once.
"""

from __future__ import annotations

from typing import Final

SESSION_ACCEPTED: Final = ("electric-session", "accepted")
