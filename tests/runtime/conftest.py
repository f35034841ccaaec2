"""Runtime tests: a real server (TestServer, on its own thread) and a real Worker on the test's loop.

Tests synchronize on events, never on sleeps (see rt_support.py).
"""
