"""Conformance tests: a fresh real server (TestServer, on its own thread) per test, and a real Worker
on the test's loop. Tests synchronize on events and gates, never on sleeps.
"""
