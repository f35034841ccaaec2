"""Between the wire (the generated protobuf messages) and Python values: one place per conversion.

Both ends use it: the server builds its responses and events here, the SDK reads
them back into its models here. It sits at the bottom of the import graph, beside
``_proto`` and ``lifecycle``: it imports nothing else of ours, so the server and
any future door (HTTP/JSON) can share it without importing the SDK's models.

- ``enums``: ``State``, ``Signal``, ``Outcome`` and the wire's other enums.
- ``times``: timestamps and durations (milliseconds, ``datetime``, ISO text).
- ``json_values``: JSON values (``google.protobuf.Value``) and plain Python.
- ``entities``: an entity's record to its wire message; its URL.
- ``events``: a stored event to its wire message, and an event's value as the RFC's JSON.
- ``rendering``: the RFC's JSON of entities, events and responses (``to_json()``, HTTP).
- ``exec_receipts``: what an exec receipt says of its generation (running, ended).
"""
