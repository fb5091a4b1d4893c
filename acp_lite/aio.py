"""Coroutines on the connection's threads: ``async def`` handlers, and awaiting a call's answer.

The threads of a connection stay what ``rpc`` says they are; this module lets coroutines take
part. Rules it keeps:

- A handler (of ``Agent`` or ``Client``) that returns a coroutine, an ``async def`` handler, has
  it run to its end as a task on an event loop: the one the application passed (``loop=``), else
  the process's own loop, run by the thread ``acp-asyncio``, started on first use and stopped at
  exit. Where the runtime has something to do after the handler (a prompt turn's end, a
  notification's turn, the checks of a result) the thread that called it (a worker, the
  delivery thread, the host's) waits for the task (``run_to_end``) and goes on with what it
  returned or raised, as with a sync handler. Where the answer is all that is left (an extension
  method, a plain request of a ``Client``) it does not wait: the task's future (``start``) is
  answered once it completes, and keeps its handler place until then, so concurrent requests'
  tasks overlap while ordering, the handler limit, error answers and capability rules stay.
- A request's ``CancelToken`` cancels the task (``CancelledError`` at its ``await``); a task that
  ends cancelled raises ``RequestCancelled`` (where the handler was called, or through its
  future), so the request answers as cancelled (a prompt turn: ``cancelled``). The answer goes
  only once the task has ended, so nothing the task sends follows it.
- A task runs in a copy of the context of the thread that called the handler (``contextvars``),
  so it belongs to the prompt turn that thread runs.
- A thread never waits for a task on the loop it runs itself (``UsageError``): it would wait
  forever.
- ``result_of`` awaits a connection's ``Future`` (a ``*_future`` form); cancelling the awaiting
  task cancels the future, which cancels the request on the wire (``$/cancel_request``).
  ``awaitable`` makes a handle's ``<method>_async`` of its ``<method>_future`` that way, with the
  same arguments: nothing is checked or sent until it is awaited.
- ``asyncio`` is imported on first use, never by ``import acp_lite``: a sync application pays
  nothing for this module.
"""

import atexit
import sys
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Optional, TypeVar

from .answering import CancelToken
from .errors import RequestCancelled, UsageError
from .outcomes import HandlerTask
from .transport import running_loop

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop as EventLoop
    from typing import Concatenate, ParamSpec  # novermin: only for mypy

    Params = ParamSpec("Params")
else:
    EventLoop = object  # the annotations' name for an event loop, without importing asyncio

__all__ = [
    "LOOP_THREAD_NAME",
    "EventLoop",
    "awaitable",
    "default_loop",
    "result_of",
    "run_to_end",
    "start",
    "stop_default_loop",
]

Returned = TypeVar("Returned")
Handle = TypeVar("Handle")

LOOP_THREAD_NAME = "acp-asyncio"

_EAGER = sys.version_info >= (3, 12)

# How long stopping the default loop at exit waits for its tasks to end once cancelled.
_STOP_SECONDS = 2.0


class _LoopThread:
    """The process's default event loop and the daemon thread that runs it."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=LOOP_THREAD_NAME, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.loop.run_forever()
        self.loop.close()

    def stop(self) -> None:
        """Cancel the loop's tasks, give them ``_STOP_SECONDS`` to end, stop the loop and join it."""
        import asyncio

        async def finish() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_STOP_SECONDS)
            await self.loop.shutdown_asyncgens()

        finished = asyncio.run_coroutine_threadsafe(finish(), self.loop)
        try:
            finished.result(_STOP_SECONDS + 1)
        except Exception:  # a task that would not end: the loop stops all the same
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(_STOP_SECONDS)


_default: Optional[_LoopThread] = None
_default_lock = threading.Lock()


def default_loop() -> "EventLoop":
    """The process's event loop for coroutine handlers, its thread started on first use."""
    global _default
    running = _default  # (asked for every request a coroutine handler answers: the lock only to start it)
    if running is not None:
        return running.loop
    with _default_lock:
        if _default is None:
            _default = _LoopThread()
            atexit.register(stop_default_loop)
        return _default.loop


def stop_default_loop() -> None:
    """Stop the process's default loop, if it runs: its tasks are cancelled first. Called at
    exit; a later coroutine handler starts a new one."""
    global _default
    with _default_lock:
        running, _default = _default, None
    if running is not None:
        atexit.unregister(stop_default_loop)
        running.stop()


def start(
    coroutine: Coroutine[Any, Any, Returned], loop: "Optional[EventLoop]", token: Optional[CancelToken]
) -> "HandlerTask":
    """Run ``coroutine`` as a task on ``loop`` (None: the default loop), in a copy of this
    thread's context; the returned future gets what it returns or raises (``RequestCancelled`` if
    it ended cancelled). ``token`` cancels the task."""
    target = loop if loop is not None else default_loop()
    outcome = _LoopTask(coroutine, target)
    try:
        if running_loop() is target:
            outcome.begin()
        else:
            target.call_soon_threadsafe(outcome.begin)
    except RuntimeError:  # the loop is closed
        coroutine.close()
        raise UsageError("the event loop for coroutine handlers is closed") from None
    if token is not None:
        token.add_callback(outcome.cancel_task)
    return outcome


class _LoopTask(HandlerTask):
    """A coroutine handler's task on an event loop, and its outcome. Made for every request a
    coroutine handler answers, so it is one object with bound methods, not closures."""

    __slots__ = ("_coroutine", "_loop", "_task")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], loop: "EventLoop") -> None:
        super().__init__()
        self._coroutine = coroutine
        self._loop = loop
        self._task: Any = None

    def begin(self) -> None:
        # On the loop, in a copy of the caller's context (call_soon_threadsafe's, or this thread's own).
        if _EAGER:  # its first step at once: a handler that never waits is answered without a turn of the loop
            self._task = _asyncio().Task(self._settling(), loop=self._loop, eager_start=True)  # novermin
        else:
            self._task = self._loop.create_task(self._settling())

    def cancel_task(self) -> None:
        if not self._loop.is_closed():  # closed meanwhile (the default one at exit): its tasks were cancelled
            self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        # On the loop, after begin(): callbacks run in the order they were added.
        self._task.add_done_callback(self._settle_unstarted)
        self._task.cancel()

    async def _settling(self) -> None:
        # The outcome is settled in the task's last step, sparing the loop a turn for a done-callback.
        try:
            result = await self._coroutine
        except _asyncio().CancelledError:
            self.set_exception(_task_cancelled())
        except BaseException as exc:
            self.set_exception(exc)
        else:
            self.set_result(result)

    def _settle_unstarted(self, _: Any) -> None:
        # Cancelled before its first step, a task ends without running _settling: the handler's coroutine never ran.
        if not self.done():
            self._coroutine.close()
            self.set_exception(_task_cancelled())


def run_to_end(
    coroutine: Coroutine[Any, Any, Returned], loop: "Optional[EventLoop]", token: Optional[CancelToken]
) -> Returned:
    """Run ``coroutine`` as ``start`` does and wait for its end on this thread: returns what it
    returned, raises what it raised, and ``RequestCancelled`` if it ended cancelled."""

    target = loop if loop is not None else default_loop()
    if running_loop() is target:
        coroutine.close()
        raise UsageError(
            "a coroutine handler was called on its event loop's own thread, which cannot wait for it: "
            "serve the connection from another thread than the loop's"
        )
    outcome = start(coroutine, target, token)
    try:
        return outcome.result()
    except BaseException:
        if not outcome.done():  # the wait itself was interrupted (Ctrl-C on the main thread)
            outcome.cancel_task()  # its task must not run on with nobody waiting for it
        raise


def _asyncio() -> Any:
    # asyncio, imported once a coroutine handler runs (never by a sync application).
    import asyncio

    return asyncio


def _task_cancelled() -> RequestCancelled:
    return RequestCancelled("the handler's task was cancelled")


async def result_of(future: "Future[Returned]") -> Returned:
    """Await a connection's ``Future``; cancelling the awaiting task cancels the future."""
    import asyncio

    return await asyncio.wrap_future(future)


class AwaitedCall(threading.local):
    """``on`` while an ``_async`` form (``awaitable``) makes its call on this thread: the future it
    awaits has no done-callbacks but the runtime's and asyncio's, which never block
    (``PendingCall.awaited``). Read as an attribute, not through a function: every
    ``call_future`` reads it."""

    on = False  # (a class attribute: a thread that never set it reads False without an AttributeError)


AWAITED_CALL = AwaitedCall()


def awaitable(
    future_form: "Callable[Concatenate[Handle, Params], Future[Returned]]",
) -> "Callable[Concatenate[Handle, Params], Coroutine[Any, Any, Returned]]":
    """The awaitable form of a handle's ``<method>_future``: the same arguments, and the answer
    awaited (see ``result_of``)."""

    async def call(handle: Any, *args: Any, **kwargs: Any) -> Any:
        AWAITED_CALL.on = True
        try:
            future = future_form(handle, *args, **kwargs)
        finally:
            AWAITED_CALL.on = False
        return await result_of(future)

    call.__name__ = future_form.__name__.replace("_future", "_async")
    call.__qualname__ = future_form.__qualname__.replace("_future", "_async")
    call.__doc__ = f"Await the answer of ``{future_form.__name__}``; cancelling the awaiting task cancels the request."
    call.__wrapped__ = future_form  # type: ignore[attr-defined]  # its signature, for help() and IDEs
    return call
