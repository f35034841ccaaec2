"""The service core both doors call: validation, write decisions, errors, watches, deadlines.

``service.EntityService`` is the entity API; each call validates
(``validation``), then hands a pure decide function (``entity_writes``) to the
store. ``errors`` is the one place a failure becomes a status; ``watch`` and
``event_feed`` serve live reads; ``reaper`` fires the deadlines that survive
restarts; ``auth`` and ``caps`` say who may do what and how much. Nothing here
knows which door a call came through (gRPC or HTTP) or how a worker is
connected (the runtime, above it).
"""
