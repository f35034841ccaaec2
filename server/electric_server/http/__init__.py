"""The HTTP/JSON door: the RFC's routes, the Durable Streams reads and SSE, over the same core.

``routes`` is the route table (data; the OpenAPI document is generated from
it by ``openapi``), each route naming its handler as a function (``handlers``:
the door's own; ``streams``: the live reads); ``door`` serves it with Starlette
and uvicorn, ``admission`` admits every request and answers its errors,
``state`` reads an entity's durable state, ``body`` and ``query`` are what it
accepts from a request.
"""
