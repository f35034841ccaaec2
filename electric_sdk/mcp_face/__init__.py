"""The MCP face: the control plane as MCP tools (docs/mcp.md). ``face.py`` is the server,
``tools.json`` its tools, generated from the HTTP door's route table."""

from .face import Backend, Refusal, build_server, tool_list

__all__ = ["Backend", "Refusal", "build_server", "tool_list"]
