"""The HTTP/JSON door: the RFC's routes, the Durable Streams reads and SSE, over the same core.

``routes`` is the route table (data; the OpenAPI document is generated from
it by ``openapi``), ``door`` serves it with Starlette and uvicorn, ``streams``
and ``state`` are its live and durable-state reads, ``body`` and ``query`` what
it accepts from a request.
"""
