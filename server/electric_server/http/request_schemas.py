"""What the HTTP door's routes accept, as the OpenAPI document's JSON Schemas (``http/openapi.py``).

As exactly as JSON Schema says it, both ways: a request these allow is one the door takes, and
one they refuse is refused (schemathesis's positive and negative cases check both,
tests/test_schemathesis.py); ``http/body.py`` and ``core/validation.py`` hold the rules
themselves, and the path names' patterns are here beside them.
"""

from __future__ import annotations

from typing import Any

from electric_sdk.busy import BusyPolicy
from electric_sdk.lifecycle import MESSAGE_SCOPED_SIGNALS, OPT_IN_TIMING, PAYLOAD_SIGNALS, Signal, State

from ..core.validation import (
    MAX_DURATION_MS,
    MAX_INT64,
    MAX_PAYLOAD_BYTES,
    MAX_REASON_BYTES,
    MAX_TEXT_BYTES,
    NAME_RE,
)
from .body import MAX_REASON_CHARS, MAX_TEXT_CHARS

__all__ = ["NEW_TYPE", "PATH_NAME", "PATH_TYPE", "Schema", "obj", "request_schemas"]

Schema = dict[str, Any]


def obj(required: list[str], properties: Schema) -> Schema:
    """An object of exactly these properties (a field the route does not know is UNKNOWN_FIELD)."""
    return {"type": "object", "required": required, "additionalProperties": False, "properties": properties}


NAME = NAME_RE.pattern
# A name in the path: not "." or "..", which HTTP clients resolve away.
PATH_NAME = r"(?!\.\.?$)" + NAME
# The path's type: not "_electric", whose paths are the aliases' (GET /_electric/entities lists).
PATH_TYPE = r"(?!_electric$)" + PATH_NAME
# A new type over HTTP: not starting with "_" nor, on either door, "." (RESERVED_NAME).
NEW_TYPE = r"[A-Za-z0-9-][A-Za-z0-9_.-]{0,127}"
# A code version: at most 128 characters, none a control character (INVALID_CODE_VERSION).
LABEL = {"type": "string", "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]{0,128}$"}
COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_INT64}
REASON = {
    "type": "string",
    "maxLength": MAX_REASON_CHARS,
    "description": f"at most {MAX_REASON_CHARS} characters (so at most {MAX_REASON_BYTES} bytes of UTF-8)",
}
# Any JSON value but null (a null message data or payload is none).
JSON_VALUE = {
    "type": ["object", "array", "string", "number", "boolean"],
    "description": f"any JSON value, at most {MAX_PAYLOAD_BYTES} bytes encoded, nested at most 32 deep",
}


def request_schemas() -> dict[str, Schema]:
    """What the routes accept, as exactly as JSON Schema says it: a request these allow is one
    the server takes (schemathesis's positive cases check it); http/body.py and core/validation.py
    hold the rules themselves."""
    # An optional number may also be null: the door reads it as absent (the default).
    duration = {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": MAX_DURATION_MS,
        "description": "milliseconds (null or absent: the type's default)",
    }
    states = {"type": "array", "items": {"enum": [s.value for s in State]}}
    # Only SIGUSR carries a payload; only SIGINT is scoped to a message (lifecycle.py).
    payload_signals = sorted(s.value for s in PAYLOAD_SIGNALS)
    scoped_signals = sorted(s.value for s in MESSAGE_SCOPED_SIGNALS)
    plain_signals = sorted(s.value for s in Signal if s not in PAYLOAD_SIGNALS | MESSAGE_SCOPED_SIGNALS)
    payload_signal = {"signal": {"enum": payload_signals}, "reason": REASON, "payload": JSON_VALUE}
    plain_signal = {"signal": {"enum": plain_signals}, "reason": REASON}
    # Only SIGTERM may ask to interrupt the step in progress (lifecycle.OPT_IN_TIMING), and only
    # to one entity: SignalRequest's plain branch leaves it to its own.
    interrupting = sorted(s.value for s in OPT_IN_TIMING)
    interrupt_signal = {
        "signal": {"enum": interrupting},
        "reason": REASON,
        "interrupt": {"type": "boolean", "description": "interrupt the step in progress at once"},
    }
    one_plain_signal = {
        **plain_signal,
        "signal": {"enum": [s for s in plain_signals if s not in interrupting]},
    }
    scoped_signal = {
        "signal": {"enum": scoped_signals},
        "reason": REASON,
        "message_key": {"type": "string", "pattern": f"^{NAME}$", "description": "a message's key"},
    }
    type_or_states = {
        **obj([], {"type": {"type": "string", "pattern": f"^{NAME}$"}, "states": states}),
        "anyOf": [
            {"required": ["type"]},
            {"required": ["states"], "properties": {"states": {"minItems": 1}}},
        ],
    }
    refs = obj(
        ["refs"],
        {
            "refs": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "pattern": f"^/{NAME}/{NAME}$"},
            }
        },
    )
    selector = {"oneOf": [type_or_states, refs], "description": "a type and/or states, or refs"}
    return {
        "SetVersionRequest": {
            **obj(
                [],
                {
                    "code_version": {**LABEL, "description": "empty or absent: the newest announced"},
                    "ramp_version": LABEL,
                    "ramp_percent": {"type": ["integer", "null"], "minimum": 0, "maximum": 100},
                    "reason": REASON,
                },
            ),
            # A ramp is a version and its share (1-100) together, or neither (INVALID_RAMP).
            "anyOf": [
                {"properties": {"ramp_version": {"const": ""}, "ramp_percent": {"enum": [0, None]}}},
                {
                    "required": ["ramp_version", "ramp_percent"],
                    "properties": {"ramp_version": {"minLength": 1}, "ramp_percent": {"minimum": 1}},
                },
            ],
            "description": "a version announced by the type's workers (else 409 VERSION_NOT_ANNOUNCED)",
        },
        "SpawnRequest": obj(
            [],
            {
                "profile": obj([], {"grace_period_ms": duration, "idle_timeout_ms": duration}),
                "parent": {
                    "type": "string",
                    "pattern": f"^/?{PATH_NAME}/{PATH_NAME}$",
                    "description": "the entity it works for, /{type}/{id}: it must exist and not have "
                    "ended (else 404 PARENT_NOT_FOUND or 409 PARENT_ENDED); its SIGTERM and SIGKILL "
                    "cascade to the child",
                },
            },
        ),
        "ForkRequest": obj(
            ["id"],
            {
                "id": {"type": "string", "pattern": f"^{PATH_NAME}$"},
                "offset": {
                    **COUNT,
                    "type": ["integer", "null"],
                    "description": "fork before this offset (null or absent: the origin's head)",
                },
                "reason": REASON,
            },
        ),
        "RetryRequest": obj(
            ["run"],
            {
                "run": {"type": "string", "pattern": f"^{NAME}$", "description": "the run's message key"},
                "from_step": {
                    **COUNT,
                    "type": ["integer", "null"],
                    "description": "the first step executed again (null or absent: 0, all)",
                },
                "reason": REASON,
            },
        ),
        "SignalRequest": {
            "oneOf": [
                obj(["signal"], props)
                for props in (payload_signal, one_plain_signal, scoped_signal, interrupt_signal)
            ],
            "description": "a payload only with SIGUSR, a message_key only with SIGINT, interrupt only "
            "with SIGTERM; signal names "
            "are also accepted as sigterm, TERM or SIGNAL_SIGTERM",
        },
        "SignalManyRequest": {
            "oneOf": [
                obj(["selector", "signal"], {**props, "selector": selector})
                for props in (
                    payload_signal,
                    {**plain_signal, "signal": {"enum": scoped_signals + plain_signals}},
                )
            ]
        },
        "MessageRequest": {
            **obj(
                [],
                {
                    "text": {"type": "string", "maxLength": MAX_TEXT_CHARS},
                    "data": JSON_VALUE,
                    "policy": {
                        "enum": [p.value for p in BusyPolicy],
                        "description": "what it does if a run is in progress (docs/double-texting.md); "
                        "default: its entity type's policy",
                    },
                },
            ),
            "anyOf": [
                {"required": ["text"], "properties": {"text": {"minLength": 1}}},
                {"required": ["data"]},
            ],
            "description": f"text (at most {MAX_TEXT_CHARS} characters, so at most {MAX_TEXT_BYTES} "
            "bytes of UTF-8) and/or data",
        },
    }
