"""Small builders for the values agents and editors write most: content blocks, session updates,
tool calls, plans and permission answers. Each returns a plain ``acp_lite.schema`` value, so the
full types stay available for anything these do not cover. Pure functions: any thread.
"""

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from .codec import UnknownVariant
from .schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    Content,
    Cost,
    Diff,
    PermissionOption,
    PermissionOptionKind,
    Plan,
    PlanEntry,
    PlanEntryPriority,
    PlanEntryStatus,
    RequestPermissionOutcomeCancelled,
    RequestPermissionResponse,
    SelectedPermissionOutcome,
    SessionUpdateToolCallUpdate,
    Terminal,
    TextContent,
    ToolCall,
    ToolCallContent,
    ToolCallLocation,
    ToolCallStatus,
    ToolCallUpdate,
    ToolKind,
    UsageUpdate,
    UserMessageChunk,
)

__all__ = [
    "cancelled_permission",
    "diff",
    "location",
    "permission_option",
    "permission_options",
    "plan",
    "select_permission",
    "selected_option",
    "terminal",
    "text_block",
    "text_chunk",
    "thought_chunk",
    "tool_call",
    "tool_call_ref",
    "tool_call_update",
    "tool_content",
    "usage",
    "user_chunk",
    "variant_tag",
]


def variant_tag(value: Any) -> Optional[str]:
    """The discriminator of a union member: ``"agent_message_chunk"`` for an update, ``"text"`` for
    a content block, the raw tag of an ``UnknownVariant``; None for a variant without a tag."""
    if isinstance(value, UnknownVariant):
        return value.tag
    config = getattr(value, "__struct_config__", None)
    tag = config.tag if config is not None else None
    return tag if isinstance(tag, str) else None


def text_block(text: str) -> TextContent:
    """A text content block, for prompts and message chunks."""
    return TextContent(text=text)


def text_chunk(text: str, message_id: Optional[str] = None) -> AgentMessageChunk:
    """An ``agent_message_chunk`` update carrying text."""
    return AgentMessageChunk(content=TextContent(text=text), message_id=message_id)


def thought_chunk(text: str, message_id: Optional[str] = None) -> AgentThoughtChunk:
    """An ``agent_thought_chunk`` update carrying text."""
    return AgentThoughtChunk(content=TextContent(text=text), message_id=message_id)


def user_chunk(text: str, message_id: Optional[str] = None) -> UserMessageChunk:
    """A ``user_message_chunk`` update (e.g. when replaying a loaded session)."""
    return UserMessageChunk(content=TextContent(text=text), message_id=message_id)


def tool_call(
    tool_call_id: str,
    title: str,
    *,
    name: Optional[str] = None,
    kind: Optional[ToolKind] = None,
    status: Optional[ToolCallStatus] = None,
    content: Optional[List[ToolCallContent]] = None,
    locations: Optional[List[ToolCallLocation]] = None,
    raw_input: Any = None,
    raw_output: Any = None,
    meta: Optional[Dict[str, Any]] = None,
) -> ToolCall:
    """A ``tool_call`` update."""
    return ToolCall(
        tool_call_id=tool_call_id,
        title=title,
        name=name,
        kind=kind,
        status=status,
        content=content,
        locations=locations,
        raw_input=raw_input,
        raw_output=raw_output,
        meta=meta,
    )


def tool_call_update(
    tool_call_id: str,
    *,
    kind: Optional[ToolKind] = None,
    status: Optional[ToolCallStatus] = None,
    title: Optional[str] = None,
    name: Optional[str] = None,
    content: Optional[List[ToolCallContent]] = None,
    locations: Optional[List[ToolCallLocation]] = None,
    raw_input: Any = None,
    raw_output: Any = None,
    meta: Optional[Dict[str, Any]] = None,
) -> SessionUpdateToolCallUpdate:
    """A ``tool_call_update`` update changing only the given fields (status, content, ...)."""
    return SessionUpdateToolCallUpdate(
        tool_call_id=tool_call_id,
        kind=kind,
        status=status,
        title=title,
        name=name,
        content=content,
        locations=locations,
        raw_input=raw_input,
        raw_output=raw_output,
        meta=meta,
    )


def tool_call_ref(
    tool_call_id: str,
    *,
    kind: Optional[ToolKind] = None,
    status: Optional[ToolCallStatus] = None,
    title: Optional[str] = None,
    name: Optional[str] = None,
    content: Optional[List[ToolCallContent]] = None,
    locations: Optional[List[ToolCallLocation]] = None,
    raw_input: Any = None,
    raw_output: Any = None,
    meta: Optional[Dict[str, Any]] = None,
) -> ToolCallUpdate:
    """The tool call a permission request is about."""
    return ToolCallUpdate(
        tool_call_id=tool_call_id,
        kind=kind,
        status=status,
        title=title,
        name=name,
        content=content,
        locations=locations,
        raw_input=raw_input,
        raw_output=raw_output,
        meta=meta,
    )


def tool_content(block: Union[str, Any]) -> Content:
    """Tool call content showing a content block (text when given a string)."""
    return Content(content=text_block(block) if isinstance(block, str) else block)


def diff(path: str, new_text: str, old_text: Optional[str] = None) -> Diff:
    """Tool call content showing a file change; ``old_text`` None means a new file."""
    return Diff(path=path, new_text=new_text, old_text=old_text)


def terminal(terminal_id: str) -> Terminal:
    """Tool call content embedding a terminal created with ``terminal/create``."""
    return Terminal(terminal_id=terminal_id)


def location(path: str, line: Optional[int] = None) -> ToolCallLocation:
    return ToolCallLocation(path=path, line=line)


def plan(entries: Iterable[Union[PlanEntry, Tuple[str, PlanEntryPriority, PlanEntryStatus]]]) -> Plan:
    """A ``plan`` update: the complete list of entries, each a ``PlanEntry`` or a
    ``(content, priority, status)`` tuple."""
    return Plan(
        entries=[
            e if isinstance(e, PlanEntry) else PlanEntry(content=e[0], priority=e[1], status=e[2]) for e in entries
        ]
    )


def usage(used: int, size: int, *, cost: Optional[Cost] = None, meta: Optional[Dict[str, Any]] = None) -> UsageUpdate:
    """A ``usage_update``: context tokens used out of ``size`` (and optionally the cost)."""
    return UsageUpdate(used=used, size=size, cost=cost, meta=meta)


def permission_option(option_id: str, name: str, kind: PermissionOptionKind) -> PermissionOption:
    return PermissionOption(option_id=option_id, name=name, kind=kind)


def permission_options(*options: Tuple[str, str, PermissionOptionKind]) -> List[PermissionOption]:
    """Several ``(option_id, name, kind)`` options at once."""
    return [permission_option(*option) for option in options]


def select_permission(option_id: str) -> RequestPermissionResponse:
    """The editor's answer: the user chose ``option_id``."""
    return RequestPermissionResponse(outcome=SelectedPermissionOutcome(option_id=option_id))


def cancelled_permission() -> RequestPermissionResponse:
    """The editor's answer when the turn was cancelled before the user chose."""
    return RequestPermissionResponse(outcome=RequestPermissionOutcomeCancelled())


def selected_option(response: RequestPermissionResponse) -> Optional[str]:
    """The option the user chose, or None when the request was cancelled (or the outcome unknown)."""
    outcome = response.outcome
    return outcome.option_id if isinstance(outcome, SelectedPermissionOutcome) else None
