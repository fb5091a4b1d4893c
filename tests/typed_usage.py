"""An application written against acp_lite's types, as a type checker sees it: every override point
of ``Agent`` and ``Client`` with its annotations, the builders with the protocol's literals, and the
handles' results. ``tests/test_typing.py`` runs mypy over it and expects no error; it is never run.
"""

from concurrent.futures import Future
from typing import List, Optional, Union

from typing_extensions import assert_type

from acp_lite import Agent, Client, PromptTurn, RemoteAgent, RemoteClient, Undecodable, WorkspaceClient, updates
from acp_lite.schema import (
    AuthenticateRequest,
    CancelNotification,
    CloseSessionRequest,
    CompleteElicitationNotification,
    CreateElicitationRequest,
    CreateElicitationResponse,
    CreateElicitationResponseDecline,
    CreateTerminalRequest,
    CreateTerminalResponse,
    DeleteSessionRequest,
    InitializeRequest,
    InitializeResponse,
    KillTerminalRequest,
    ListSessionsRequest,
    ListSessionsResponse,
    LoadSessionRequest,
    LoadSessionResponse,
    LogoutRequest,
    LogoutResponse,
    NewSessionRequest,
    NewSessionResponse,
    PermissionOption,
    PromptRequest,
    PromptResponse,
    ReadTextFileRequest,
    ReadTextFileResponse,
    ReleaseTerminalRequest,
    ReleaseTerminalResponse,
    RequestPermissionRequest,
    RequestPermissionResponse,
    ResumeSessionRequest,
    SessionNotification,
    SetSessionConfigOptionRequest,
    SetSessionConfigOptionResponse,
    SetSessionModeRequest,
    StopReason,
    TerminalOutputRequest,
    TerminalOutputResponse,
    WaitForTerminalExitRequest,
    WaitForTerminalExitResponse,
    WriteTextFileRequest,
)


class TypedAgent(Agent):
    def initialize(self, params: InitializeRequest) -> InitializeResponse:
        return super().initialize(params)

    def authenticate(self, params: AuthenticateRequest) -> None:  # an empty result may be None
        pass

    def logout(self, params: LogoutRequest) -> LogoutResponse:
        return LogoutResponse()

    def new_session(self, params: NewSessionRequest) -> NewSessionResponse:
        return NewSessionResponse(session_id="s1")

    def load_session(self, params: LoadSessionRequest) -> LoadSessionResponse:
        self.client.session_update(params.session_id, updates.user_chunk("earlier"))
        return LoadSessionResponse()

    def resume_session(self, params: ResumeSessionRequest) -> None:
        pass

    def list_sessions(self, params: ListSessionsRequest) -> ListSessionsResponse:
        return ListSessionsResponse(sessions=[])

    def close_session(self, params: CloseSessionRequest) -> None:
        pass

    def delete_session(self, params: DeleteSessionRequest) -> None:
        pass

    def prompt(self, params: PromptRequest, turn: PromptTurn) -> Union[PromptResponse, StopReason]:
        turn.send(updates.tool_call("c1", "Read the file", kind="read", status="pending"))
        turn.send(updates.plan([("Read", "high", "in_progress"), ("Answer", "medium", "pending")]))
        answer = self.client.request_permission(
            turn.session_id,
            updates.tool_call_ref("c1", kind="edit", status="pending"),
            [updates.permission_option("allow", "Allow", "allow_once"), *self.rejections()],
            timeout=60,
        )
        assert_type(answer, RequestPermissionResponse)
        if updates.selected_option(answer) != "allow":
            return "cancelled"
        file = self.client.read_text_file(turn.session_id, "/tmp/notes.txt")
        turn.send(updates.tool_call_update("c1", status="completed", content=[updates.tool_content(file.content)]))
        return PromptResponse(stop_reason="end_turn")

    def rejections(self) -> List[PermissionOption]:
        return updates.permission_options(("reject", "Reject", "reject_once"), ("never", "Never", "reject_always"))

    def cancel(self, params: CancelNotification) -> None:
        pass

    def set_mode(self, params: SetSessionModeRequest) -> None:
        pass

    def set_config_option(self, params: SetSessionConfigOptionRequest) -> SetSessionConfigOptionResponse:
        return SetSessionConfigOptionResponse(config_options=[])


class TypedClient(Client):
    def session_update(self, params: Union[SessionNotification, Undecodable]) -> None:
        if isinstance(params, SessionNotification):
            assert_type(updates.variant_tag(params.update), Optional[str])

    def request_permission(self, params: RequestPermissionRequest) -> "Future[RequestPermissionResponse]":
        answer: Future[RequestPermissionResponse] = Future()  # settled when the user chooses
        answer.set_result(updates.select_permission(params.options[0].option_id))
        return answer

    def read_text_file(self, params: ReadTextFileRequest) -> ReadTextFileResponse:
        return ReadTextFileResponse(content="")

    def write_text_file(self, params: WriteTextFileRequest) -> None:
        pass

    def create_terminal(self, params: CreateTerminalRequest) -> CreateTerminalResponse:
        return CreateTerminalResponse(terminal_id="t1")

    def terminal_output(self, params: TerminalOutputRequest) -> TerminalOutputResponse:
        return TerminalOutputResponse(output="", truncated=False)

    def wait_for_terminal_exit(self, params: WaitForTerminalExitRequest) -> WaitForTerminalExitResponse:
        return WaitForTerminalExitResponse(exit_code=0)

    def kill_terminal(self, params: KillTerminalRequest) -> None:
        pass

    def release_terminal(self, params: ReleaseTerminalRequest) -> ReleaseTerminalResponse:
        return ReleaseTerminalResponse()

    def create_elicitation(self, params: CreateElicitationRequest) -> CreateElicitationResponse:
        return CreateElicitationResponseDecline()

    def complete_elicitation(self, params: CompleteElicitationNotification) -> None:
        pass


class TypedWorkspace(WorkspaceClient):
    def read_text_file(self, params: ReadTextFileRequest) -> ReadTextFileResponse:
        return super().read_text_file(params)


def drive(agent: RemoteAgent, client: RemoteClient) -> None:
    session = agent.new_session("/tmp")
    assert_type(session, NewSessionResponse)
    assert_type(agent.prompt(session.session_id, "hello").stop_reason, StopReason)
    assert_type(agent.prompt_future(session.session_id, "hello"), "Future[PromptResponse]")
    assert_type(client.read_text_file("s1", "/tmp/notes.txt").content, str)


class TypedAsyncAgent(Agent):
    """The same override points as coroutines (docs/async.md)."""

    async def new_session(self, params: NewSessionRequest) -> NewSessionResponse:
        return NewSessionResponse(session_id="s1")

    async def prompt(self, params: PromptRequest, turn: PromptTurn) -> StopReason:
        answer = await turn.request_permission_async(updates.tool_call_ref("c1"), self.rejections())
        assert_type(answer, RequestPermissionResponse)
        read = await self.client.read_text_file_async(turn.session_id, "/tmp/notes.txt", line=1)
        assert_type(read.content, str)
        created = await self.client.create_terminal_async(turn.session_id, "make", ["test"], cwd="/tmp")
        assert_type(created, CreateTerminalResponse)
        turn.send(updates.text_chunk(read.content))
        return "end_turn"

    def rejections(self) -> List[PermissionOption]:
        return updates.permission_options(("no", "No", "reject_once"))

    async def cancel(self, params: CancelNotification) -> None:
        pass


class TypedAsyncClient(Client):
    async def session_update(self, params: Union[SessionNotification, Undecodable]) -> None:
        pass

    async def read_text_file(self, params: ReadTextFileRequest) -> ReadTextFileResponse:
        return ReadTextFileResponse(content="")

    async def write_text_file(self, params: WriteTextFileRequest) -> None:
        pass


async def drive_from_asyncio(agent: RemoteAgent) -> None:
    session = await agent.new_session_async("/tmp")
    assert_type(session, NewSessionResponse)
    assert_type((await agent.prompt_async(session.session_id, "hello")).stop_reason, StopReason)
    assert_type(await agent.initialize_async(), InitializeResponse)
