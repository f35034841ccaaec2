"""The worker protocol: sessions, leases, delivery, fenced writes, lease sweeps, type profiles.

``connect.RuntimeService`` is the gRPC service workers connect to;
``hosting.Runtime`` holds this replica's sessions (``local_leases``) and the
leases they hold, and sends them what they are leased; ``requests`` applies
what workers ask on their sessions. The decide functions of the runtime's fenced
writes are in ``writes``, their answers in ``answers``. ``lease_sweep`` ends
leases whose holder is gone and offers entities that want a runtime;
``profiles`` keeps the entity types' defaults that workers announce.
"""
