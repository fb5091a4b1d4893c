"""Builders for the v2 values agents and editors write most, named like their v1 counterparts in
``acp_lite.updates`` where one exists, so moving an agent to v2 is mostly an import and a message
id. Each returns a plain ``acp_lite.v2.schema`` value. Pure functions: any thread.

What v2 changes in these shapes: every message chunk names its message (``message_id``, the same
for all chunks of one message); a tool call is created by its first upsert (``tool_call``) and
patched by later ones (``tool_call_update``: fields left out stay as they were); content can be
appended to a tool call (``tool_call_content``); plans have ids (``plan``); terminal output is
display-only bytes (``terminal_output``, ``terminal_update``); the turn's progress is a
``state_update`` (``running``, ``idle``).
"""

import base64
import uuid
from typing import Any, Iterable, Optional, Tuple, Union

# Permission options and answers are written the same in both versions: v1's builders serve.
from ..updates import cancelled_permission, permission_option, permission_options, select_permission, variant_tag
from .schema import (
    AgentMessage,
    AgentMessageChunk,
    AgentThoughtChunk,
    Content,
    Diff,
    DiffChangeModify,
    DiffPatch,
    PlanEntry,
    PlanItems,
    PlanUpdate,
    SelectedPermissionOutcome,
    SessionUpdateStateUpdate,
    SessionUpdateToolCallUpdate,
    Terminal,
    TerminalOutput,
    TerminalOutputChunk,
    TerminalUpdate,
    TextContent,
    ToolCallContentChunk,
    ToolCallLocation,
    ToolCallPermissionSubject,
    ToolCallUpdate,
    UsageUpdate,
    UserMessage,
    UserMessageChunk,
)

__all__ = [
    "agent_message",
    "cancelled_permission",
    "diff",
    "idle",
    "location",
    "new_id",
    "permission_option",
    "permission_options",
    "plan",
    "running",
    "select_permission",
    "selected_option",
    "terminal",
    "terminal_output",
    "terminal_update",
    "text_block",
    "text_chunk",
    "thought_chunk",
    "tool_call",
    "tool_call_content",
    "tool_call_ref",
    "tool_call_subject",
    "tool_call_update",
    "tool_content",
    "usage",
    "user_chunk",
    "user_message",
    "variant_tag",
]


def new_id(prefix: str = "msg") -> str:
    """A fresh opaque id (for messages, plans, tool calls)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def text_block(text: str) -> TextContent:
    return TextContent(text=text)


def _block(content: Union[str, Any]) -> Any:
    return text_block(content) if isinstance(content, str) else content


def text_chunk(text: Union[str, Any], message_id: str) -> AgentMessageChunk:
    """An ``agent_message_chunk`` appending text (or a content block) to message ``message_id``."""
    return AgentMessageChunk(message_id=message_id, content=_block(text))


def thought_chunk(text: Union[str, Any], message_id: str) -> AgentThoughtChunk:
    return AgentThoughtChunk(message_id=message_id, content=_block(text))


def user_chunk(text: Union[str, Any], message_id: str) -> UserMessageChunk:
    return UserMessageChunk(message_id=message_id, content=_block(text))


def agent_message(message_id: str, content: Iterable[Union[str, Any]]) -> AgentMessage:
    """An ``agent_message`` upsert: ``content`` replaces the message's content (empty clears it)."""
    return AgentMessage(message_id=message_id, content=[_block(c) for c in content])


def user_message(message_id: str, content: Iterable[Union[str, Any]]) -> UserMessage:
    """A ``user_message`` upsert (the agent's acknowledgment of a prompt, or a replayed one)."""
    return UserMessage(message_id=message_id, content=[_block(c) for c in content])


def tool_call(tool_call_id: str, title: str, **fields: Any) -> SessionUpdateToolCallUpdate:
    """The first upsert of a tool call, which creates it; ``fields`` are the optional ones of
    ``ToolCallUpdate`` (kind, status, content, locations, raw_input, ...)."""
    return SessionUpdateToolCallUpdate(tool_call_id=tool_call_id, title=title, **fields)


def tool_call_update(tool_call_id: str, **fields: Any) -> SessionUpdateToolCallUpdate:
    """A later upsert: only the given ``fields`` change (an array given replaces the whole array)."""
    return SessionUpdateToolCallUpdate(tool_call_id=tool_call_id, **fields)


def tool_call_content(tool_call_id: str, content: Union[str, Any]) -> ToolCallContentChunk:
    """A ``tool_call_content_chunk`` appending one content item (text when given a string)."""
    item = content if isinstance(content, (Content, Diff, Terminal)) else tool_content(content)
    return ToolCallContentChunk(tool_call_id=tool_call_id, content=item)


def tool_call_ref(tool_call_id: str, **fields: Any) -> ToolCallUpdate:
    """The tool call state a permission request's subject carries."""
    return ToolCallUpdate(tool_call_id=tool_call_id, **fields)


def tool_call_subject(tool_call_id: str, **fields: Any) -> ToolCallPermissionSubject:
    """A permission request's ``tool_call`` subject."""
    return ToolCallPermissionSubject(tool_call=tool_call_ref(tool_call_id, **fields))


def tool_content(block: Union[str, Any]) -> Content:
    return Content(content=_block(block))


def diff(path: str, patch: Optional[str] = None) -> Diff:
    """Tool call content for a modified file, with its ``git_patch`` text when given."""
    return Diff(
        changes=[DiffChangeModify(path=path)],
        patch=None if patch is None else DiffPatch(format="git_patch", text=patch),
    )


def terminal(terminal_id: str) -> Terminal:
    """Tool call content referring to a display terminal the agent owns."""
    return Terminal(terminal_id=terminal_id)


def terminal_update(terminal_id: str, *, output: Optional[bytes] = None, **fields: Any) -> TerminalUpdate:
    """A ``terminal_update`` upsert; ``output`` (bytes) replaces all output shown so far."""
    snapshot = None if output is None else TerminalOutput(data=base64.b64encode(output).decode("ascii"))
    return TerminalUpdate(terminal_id=terminal_id, output=snapshot, **fields)


def terminal_output(terminal_id: str, data: bytes) -> TerminalOutputChunk:
    """A ``terminal_output_chunk`` appending ``data`` (each chunk is base64-encoded on its own)."""
    return TerminalOutputChunk(terminal_id=terminal_id, data=base64.b64encode(data).decode("ascii"))


def location(path: str, line: Optional[int] = None) -> ToolCallLocation:
    return ToolCallLocation(path=path, line=line)


def plan(entries: Iterable[Union[PlanEntry, Tuple[str, str, str]]], plan_id: str = "plan") -> PlanUpdate:
    """A ``plan_update`` replacing the entries of plan ``plan_id``; each entry a ``PlanEntry`` or
    a ``(content, priority, status)`` tuple."""
    items = [e if isinstance(e, PlanEntry) else PlanEntry(content=e[0], priority=e[1], status=e[2]) for e in entries]
    return PlanUpdate(plan=PlanItems(plan_id=plan_id, entries=items))


def usage(used: int, size: int, **fields: Any) -> UsageUpdate:
    return UsageUpdate(used=used, size=size, **fields)


def running() -> SessionUpdateStateUpdate:
    return SessionUpdateStateUpdate(state="running")


def idle(stop_reason: Optional[str] = None, **fields: Any) -> SessionUpdateStateUpdate:
    """``idle``, with the stop reason when it ends foreground work."""
    return SessionUpdateStateUpdate(state="idle", stop_reason=stop_reason, **fields)


def selected_option(response: Any) -> Optional[str]:
    """The option chosen, or None (cancelled, or an outcome this version does not know, which
    must never count as approval)."""
    outcome = response.outcome
    return outcome.option_id if isinstance(outcome, SelectedPermissionOutcome) else None
