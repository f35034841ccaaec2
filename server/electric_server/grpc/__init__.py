"""The gRPC door: the grpc.aio server's handlers guard, auth interceptor, health and reflection.

Only this room (and ``fastpaths.acceptors``) knows grpc.aio's server; the
services it serves are the core's ``EntityService`` and the runtime's
``RuntimeService``.
"""
