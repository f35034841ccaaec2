"""Exec entities: entity types backed by an OS process, with generation-safe shutdown.

Define one in Python (``app.exec(...)``) or in a TOML file the worker loads
(``load_exec_file``); ``docs/exec.md`` has the grammar, the signal mapping and
the receipts. Modules: ``spec`` (the definition and its checks), ``config``
(the TOML file), ``evidence`` (what proves a generation), ``process`` (the
posix and portable backends, and a generation taken over), ``launcher`` (run
between the fork and the command: the parent-death signal), ``group`` (a
generation's process group and its orphans), ``output`` (stdout/stderr into the stream),
``receipts`` (the ``exec`` events written in the order of the acts, and the
stored generation read back from them), ``hooks`` (the test hook between
planning and issuing an action), ``generations`` (what one host knows of its
entity's generations, and the stored one judged at the lease), ``shutdown``
(each act on a generation, the shutdown policy, the end recorded once),
``reply`` (a message's reply read from stdout, as its run's output),
``host`` (one leased exec entity).
"""

from .config import load_exec_file, parse_exec_file
from .evidence import Evidence
from .hooks import ActionPlan, action_hook, set_action_hook
from .reply import Reply
from .spec import (
    BACKENDS,
    DEFAULT_BACKEND,
    FORCE_ACTIONS,
    GRACEFUL_ACTIONS,
    MAX_SHUTDOWN_TIMEOUT,
    SHUTDOWN_LINE,
    ExecSpec,
    ExecType,
    ShutdownPolicy,
    define,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "FORCE_ACTIONS",
    "GRACEFUL_ACTIONS",
    "MAX_SHUTDOWN_TIMEOUT",
    "SHUTDOWN_LINE",
    "ActionPlan",
    "Evidence",
    "ExecSpec",
    "ExecType",
    "Reply",
    "ShutdownPolicy",
    "action_hook",
    "define",
    "load_exec_file",
    "parse_exec_file",
    "set_action_hook",
]
