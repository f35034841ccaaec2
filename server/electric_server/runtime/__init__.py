"""The worker protocol: sessions, leases, delivery, fenced writes, lease sweeps, type profiles.

``service.RuntimeService`` is the gRPC service workers connect to;
``service.Runtime`` holds this replica's sessions (``local_leases``) and the
decide functions of the runtime's fenced writes are in ``writes``, their
answers in ``answers``. ``lease_sweep`` ends leases whose holder is gone and
offers entities that want a runtime; ``profiles`` keeps the entity types'
defaults that workers announce.
"""
