"""A randomized soak of two linked connections (acp_lite.rpc) over a pipe pair.

Several threads on each side at once (the main thread among them, which never reads its own
answers) send a seeded random mix: blocking calls with and without timeouts, futures (some
cancelled, which sends ``$/cancel_request``), notifications alone and in bursts. The handlers on
the far side answer at once, sleep or wait a few milliseconds, raise, call back the other side
(nested, a few levels deep, blocking or through a future), notify before answering, wait for
a notification the caller sends after the request, or have an arrival hook. So requests run on
the reader, the runner and the threads that replace them, and answers are read by the reader, the
delivery thread and the callers the reading is lent to.

Every request carries a token that names it; what is checked afterwards:

- each call ends with its own answer, its own error, ``CallTimeout`` or its cancellation, and
  every future's outcome is settled once, where callbacks run (or on the thread that added the
  callback to a future already done, or that cancelled it);
- each handler ran exactly once for each request sent (a cancelled or timed-out one included);
- a notification sent before an answer is delivered before that answer surfaces;
- the notifications of one sending thread are delivered, all of them, in the order it sent them;
- nothing hangs, nothing unexpected is logged as an error, no call or request is left pending,
  and ``close()`` leaves no thread behind (conftest's ``no_leaks``).

The second test closes one side in the middle of the traffic (from the main thread, or from a
handler): every call then ends with its answer, its error or ``ConnectionClosed`` (or -32800
for a request the closing side refused), and each sender's delivered notifications are a prefix
of what it sent. A failure names its seed; the thread interleaving differs between runs, the
operations each thread performs do not.
"""

import logging
import random
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pytest

from acp_lite.errors import (
    AcpError,
    CallTimeout,
    ConnectionClosed,
    InternalError,
    InvalidParams,
    RequestCancelled,
    UsageError,
)
from acp_lite.rpc import Connection
from acp_lite.wire import memory_pair

SEEDS = [7, 1312, 90210]
WAIT = 10  # seconds anything that should happen soon may take before it counts as a hang
TRAFFIC_SECONDS = 1.5  # drivers stop starting operations after this (a bound, not an assertion)
DRIVERS_PER_SIDE = 3
OPERATIONS_PER_DRIVER = 300
MAX_DEPTH = 3
SIDES = ("a", "b")

# Errors a handler logs on purpose: a RuntimeError in soak/raise; once closing, a nested call or a
# notification failing with ConnectionClosed inside a handler.
EXPECTED_HANDLER_FAILURES = ("handler for soak/raise failed",)
EXPECTED_HANDLER_FAILURES_WHEN_CLOSING = (
    "handler for soak/nest failed",
    "handler for soak/tell failed",
)


def expected_nest(token: str, depth: int) -> Any:
    if depth == 0:
        return {"token": token}
    return {"token": token, "inner": expected_nest(token + "/", depth - 1)}


class Soak:
    """What both sides share: the seed, the problems found, and the requests sent and handled."""

    def __init__(self, seed: int, closing: bool) -> None:
        self.seed = seed
        self.closing = closing  # the mid-traffic close test: looser outcomes
        self.lock = threading.Lock()
        self.problems: List[str] = []
        self.sent: Counter = Counter()  # (side handling it, token)
        self.handled: Counter = Counter()
        self.operations = 0  # operations finished, all drivers together
        self.sides: Dict[str, Side] = {}

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def sending(self, to_side: str, token: str) -> None:
        with self.lock:
            self.sent[(to_side, token)] += 1

    def report(self) -> str:
        shown = self.problems[:15]
        more = f"\n... and {len(self.problems) - 15} more" if len(self.problems) > 15 else ""
        return f"seed {self.seed}: " + "\n".join(shown) + more


class Side:
    """One connection and its handlers; ``peer`` is the other side's name."""

    def __init__(self, name: str, connection: Connection, soak: Soak) -> None:
        self.name = name
        self.peer = "b" if name == "a" else "a"
        self.connection = connection
        self.soak = soak
        self.lock = threading.Lock()
        self.notes: Dict[str, List[int]] = {}  # sender -> sequence numbers, as delivered
        self.told: Set[str] = set()
        self.gates: Dict[str, threading.Event] = {}
        self.arrived: Set[str] = set()  # tokens of soak/hooked requests whose arrival hook ran
        requests: Dict[str, Callable[[Any, Any], Any]] = {
            "soak/echo": self.echo,
            "soak/sleep": self.sleep,
            "soak/slow": self.slow,
            "soak/raise": self.fail,
            "soak/nest": self.nest,
            "soak/tell": self.tell,
            "soak/gate": self.gate,
            "soak/close": self.close_from_handler,
        }
        for method, handler in requests.items():
            connection.on_request(method, self.counted(handler))
        # Like soak/slow, with an arrival hook (run on the delivery thread before the handler):
        # such a request is never run by the reader, always queued for the runner.
        connection.on_request("soak/hooked", self.counted(self.hooked), on_arrival=self.on_arrival)
        connection.on_notification("soak/note", self.on_note)
        connection.on_notification("soak/told", self.on_told)
        connection.on_notification("soak/open", lambda params: self.gate_event(params["token"]).set())

    # -- handlers (reader, runner or their replacements) -----------------------------------------
    def counted(self, handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def run(params: Any, ctx: Any) -> Any:
            with self.soak.lock:
                self.soak.handled[(self.name, params["token"])] += 1
            return handler(params, ctx)

        return run

    def echo(self, params: Any, ctx: Any) -> Any:
        return {"token": params["token"]}

    def sleep(self, params: Any, ctx: Any) -> Any:
        time.sleep(params["ms"] / 1000)
        return {"token": params["token"]}

    def slow(self, params: Any, ctx: Any) -> Any:
        if ctx.cancel_token.wait(params["ms"] / 1000):
            raise RequestCancelled(data={"token": params["token"]})
        return {"token": params["token"]}

    def on_arrival(self, params: Any, ctx: Any) -> None:
        with self.lock:
            self.arrived.add(params["token"])

    def hooked(self, params: Any, ctx: Any) -> Any:
        with self.lock:
            arrived = params["token"] in self.arrived
        if not arrived:
            self.soak.problem(f"soak/hooked {params['token']}: the handler started before its arrival hook")
        return self.slow(params, ctx)

    def fail(self, params: Any, ctx: Any) -> Any:
        if params["protocol"]:
            raise InvalidParams("refused", data={"token": params["token"]})
        raise RuntimeError("a handler bug, on purpose")

    def nest(self, params: Any, ctx: Any) -> Any:
        token, depth, mode = params["token"], params["depth"], params["mode"]
        if depth == 0:
            return {"token": token}
        inner = {"token": token + "/", "depth": depth - 1, "mode": mode}
        self.soak.sending(self.peer, inner["token"])
        if mode == "call":
            result = self.connection.call("soak/nest", inner)
        elif mode == "timeout":
            result = self.connection.call("soak/nest", inner, timeout=WAIT)
        else:
            result = self.connection.call_future("soak/nest", inner).result(WAIT)
        return {"token": token, "inner": result}

    def tell(self, params: Any, ctx: Any) -> Any:
        self.connection.notify("soak/told", {"token": params["token"]})
        return {"token": params["token"]}

    def gate(self, params: Any, ctx: Any) -> Any:
        event = self.gate_event(params["token"])
        ctx.cancel_token.add_callback(event.set)  # closing cancels it: do not hold close() up
        opened = event.wait(WAIT)
        ctx.cancel_token.raise_if_cancelled()
        return {"token": params["token"], "opened": opened}

    def close_from_handler(self, params: Any, ctx: Any) -> Any:
        self.connection.close()
        return {"token": params["token"]}

    # -- notifications (delivery thread) ---------------------------------------------------------
    def on_note(self, params: Any) -> None:
        if params["ms"]:
            time.sleep(params["ms"] / 1000)
        with self.lock:
            self.notes.setdefault(params["sender"], []).append(params["seq"])

    def on_told(self, params: Any) -> None:
        with self.lock:
            self.told.add(params["token"])

    def gate_event(self, token: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(token, threading.Event())


class Driver:
    """One thread's seeded sequence of operations on one side."""

    def __init__(self, side: Side, number: int, soak: Soak, deadline: float) -> None:
        self.side = side
        self.connection = side.connection
        self.name = f"{side.name}{number}"
        self.rng = random.Random(f"{soak.seed}-{self.name}")
        self.soak = soak
        self.deadline = deadline
        self.tokens = (f"{self.name}-{n}" for n in range(1_000_000))
        self.seq = 0  # of this thread's next soak/note
        self.callbacks: List[Tuple[str, str, str]] = []  # (token, thread that ran it, how)
        self.done = threading.Event()

    def run(self) -> None:
        operations = [
            (4, self.echo_call),
            (2, self.echo_call_with_timeout),
            (3, self.futures_in_flight),
            (2, self.sleep_call),
            (2, self.raise_call),
            (3, self.nest_call),
            (2, self.tell_call),
            (1, self.gate_call),
            (2, self.call_timing_out),
            (2, self.cancelled_future),
            (2, self.burst),
            (3, self.note),
            (2, self.calls_in_a_row),
            (2, self.pause),
            (0.25, self.flood),
        ]
        weights = [w for w, _ in operations]
        try:
            for _ in range(OPERATIONS_PER_DRIVER):
                if time.monotonic() > self.deadline:
                    break
                (operation,) = self.rng.choices([op for _, op in operations], weights)
                try:
                    operation()
                except ConnectionClosed:
                    if not self.soak.closing:
                        raise
                    break  # its own side is closed (or closing): nothing more can be sent
                with self.soak.lock:
                    self.soak.operations += 1
        except BaseException:
            self.soak.problem(f"driver {self.name} failed:\n{traceback.format_exc()}")
        finally:
            self.done.set()

    # -- checking outcomes -----------------------------------------------------------------------
    def check(
        self,
        what: str,
        token: str,
        outcome: Callable[[], Any],
        expected: Any,
        own_error: Optional[Callable[[AcpError], bool]] = None,
    ) -> None:
        """Run ``outcome()`` (a call, or waiting for a future) and check it ended its own way:
        ``expected``, or an error ``own_error`` accepts as the one this request should get."""
        try:
            result = outcome()
        except FutureTimeout:
            self.soak.problem(f"{what} {token}: no outcome within {WAIT} s")
            return
        except ConnectionClosed:
            if not self.soak.closing:
                self.soak.problem(f"{what} {token}: ConnectionClosed while open")
            return
        except AcpError as exc:
            if own_error is not None and own_error(exc):
                return
            if self.soak.closing and self.closing_error(exc, what):
                return
            self.soak.problem(f"{what} {token}: unexpected {exc!r}")
            return
        if result != expected:
            self.soak.problem(f"{what} {token}: got {result!r}, expected {expected!r}")

    def closing_error(self, exc: AcpError, what: str) -> bool:
        # The far side refused a request it had not started, or cancelled a running handler, or a
        # handler's own call or notification met the closed connection (-32603).
        if isinstance(exc, RequestCancelled):
            return True
        return isinstance(exc, InternalError) and ("nest" in what or "tell" in what)

    def params(self, token: str, **more: Any) -> Dict[str, Any]:
        self.soak.sending(self.side.peer, token)
        return dict(token=token, **more)

    def watch(self, token: str, future: Future) -> Future:
        """Note where the future's done-callback runs (here, if it is already done)."""

        def done(f: Future) -> None:
            how = "cancelled" if f.cancelled() else "settled"
            try:  # refused exactly where callbacks run
                self.side.connection.refuse_blocking_here("soak/where")
                where = threading.current_thread().name
            except UsageError:
                where = "where callbacks run"
            self.callbacks.append((token, where, how))

        self.callbacks.append((token, threading.current_thread().name, "added"))
        future.add_done_callback(done)
        return future

    # -- operations ------------------------------------------------------------------------------
    def echo_call(self) -> None:
        token = next(self.tokens)
        params = self.params(token)
        self.check("call soak/echo", token, lambda: self.connection.call("soak/echo", params), {"token": token})

    def calls_in_a_row(self) -> None:
        # Blocking calls back to back, the way a reader lends the reading to its caller.
        for _ in range(self.rng.randint(2, 12)):
            self.echo_call()

    def pause(self) -> None:
        # Fewer threads busy for a moment: lone requests run on the reader, answers get lent.
        time.sleep(self.rng.choice([0.001, 0.003, 0.008]))

    def echo_call_with_timeout(self) -> None:
        token = next(self.tokens)
        params = self.params(token)
        self.check(
            "call soak/echo with timeout",
            token,
            lambda: self.connection.call("soak/echo", params, timeout=WAIT),
            {"token": token},
        )

    def futures_in_flight(self) -> None:
        waiting = []
        for _ in range(self.rng.randint(1, 6)):
            token = next(self.tokens)
            kind = self.rng.choice(["echo", "sleep", "raise", "hooked"])
            if kind == "echo":
                params = self.params(token)
            elif kind in ("sleep", "hooked"):
                params = self.params(token, ms=self.rng.randint(0, 4))
            else:
                params = self.params(token, protocol=True)
            future = self.watch(token, self.connection.call_future(f"soak/{kind}", params))
            waiting.append((kind, token, future))
        for kind, token, future in waiting:
            own = self.own_invalid_params(token) if kind == "raise" else None
            self.check(f"future soak/{kind}", token, partial(future.result, WAIT), {"token": token}, own)

    def sleep_call(self) -> None:
        token = next(self.tokens)
        params = self.params(token, ms=self.rng.randint(1, 6))
        self.check("call soak/sleep", token, lambda: self.connection.call("soak/sleep", params), {"token": token})

    def raise_call(self) -> None:
        token = next(self.tokens)
        protocol = self.rng.random() < 0.7
        params = self.params(token, protocol=protocol)
        own = self.own_invalid_params(token) if protocol else (lambda exc: type(exc) is InternalError)
        self.check("call soak/raise", token, lambda: self.connection.call("soak/raise", params), object(), own)

    def own_invalid_params(self, token: str) -> Callable[[AcpError], bool]:
        return lambda exc: type(exc) is InvalidParams and exc.data == {"token": token}

    def nest_call(self) -> None:
        token = next(self.tokens)
        depth = self.rng.randint(1, MAX_DEPTH)
        params = self.params(token, depth=depth, mode=self.rng.choice(["call", "timeout", "future"]))
        expected = expected_nest(token, depth)
        if self.rng.random() < 0.5:
            self.check("call soak/nest", token, lambda: self.connection.call("soak/nest", params), expected)
        else:
            future = self.watch(token, self.connection.call_future("soak/nest", params))
            self.check("future soak/nest", token, lambda: future.result(WAIT), expected)

    def tell_call(self) -> None:
        token = next(self.tokens)
        params = self.params(token)

        def outcome() -> Any:
            if self.rng.random() < 0.5:
                result = self.connection.call("soak/tell", params)
            else:
                result = self.watch(token, self.connection.call_future("soak/tell", params)).result(WAIT)
            with self.side.lock:
                told = token in self.side.told
            if not told:
                self.soak.problem(f"soak/tell {token}: the answer surfaced before the notification sent before it")
            return result

        self.check("call soak/tell", token, outcome, {"token": token})

    def gate_call(self) -> None:
        # The handler waits for a notification sent after the request: whoever runs it must not
        # hold up the reading (nor the delivery) of what comes next.
        token = next(self.tokens)
        future = self.watch(token, self.connection.call_future("soak/gate", self.params(token)))
        if self.rng.random() < 0.5:
            self.burst()
        self.connection.notify("soak/open", {"token": token})
        self.check("future soak/gate", token, lambda: future.result(WAIT), {"token": token, "opened": True})

    def call_timing_out(self) -> None:
        # A slow handler times out for sure; an echo's answer races the timeout (a late answer
        # is dropped; one that came in time is returned even if the wait just ran out).
        token = next(self.tokens)
        method = self.rng.choice(["soak/slow", "soak/echo"])
        params = self.params(token, ms=self.rng.randint(5, 30))
        timeout = self.rng.choice([0.0002, 0.001, 0.003, 0.01])
        self.check(
            f"call {method} with a short timeout",
            token,
            lambda: self.connection.call(method, params, timeout=timeout),
            {"token": token},
            lambda exc: type(exc) is CallTimeout,
        )

    def cancelled_future(self) -> None:
        token = next(self.tokens)
        params = self.params(token, ms=self.rng.randint(2, 30))
        method = self.rng.choice(["soak/slow", "soak/hooked"])
        future = self.watch(token, self.connection.call_future(method, params))
        pause = self.rng.choice([0, 0, 0.001, 0.003])
        if pause:
            time.sleep(pause)
        if future.cancel():
            if not future.cancelled():
                self.soak.problem(f"future {method} {token}: cancel() returned True, not cancelled")
            return

        def own(exc: AcpError) -> bool:
            return self.soak.closing and isinstance(exc, RequestCancelled)

        # Already settled: it must be its own answer.
        self.check(f"future {method}", token, lambda: future.result(WAIT), {"token": token}, own)

    def burst(self) -> None:
        for _ in range(self.rng.randint(3, 12)):
            self.send_note(0)

    def flood(self) -> None:
        # Megabytes of notifications for a delivery thread slowed down by them: the far side's
        # reader stops reading for a while (its read-ahead limit), whatever else is in flight.
        pad = "x" * 65536
        for _ in range(self.rng.randint(8, 40)):
            self.send_note(1, pad)

    def note(self) -> None:
        self.send_note(self.rng.choice([0, 0, 0, 1]))

    def send_note(self, ms: int, pad: str = "") -> None:
        self.connection.notify("soak/note", {"sender": self.name, "seq": self.seq, "ms": ms, "pad": pad})
        self.seq += 1


def run_drivers(drivers: List[Driver], on_main: Optional[Driver]) -> List[threading.Thread]:
    threads = [threading.Thread(target=d.run, name=f"soak-driver-{d.name}") for d in drivers if d is not on_main]
    for thread in threads:
        thread.start()
    if on_main is not None:
        on_main.run()
    return threads


def wait_until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def unexpected_errors(caplog: Any, soak: Soak) -> List[str]:
    allowed = EXPECTED_HANDLER_FAILURES + (EXPECTED_HANDLER_FAILURES_WHEN_CLOSING if soak.closing else ())
    found = []
    for record in caplog.records:
        if record.levelno < logging.ERROR:
            continue
        message = record.getMessage()
        if not any(text in message for text in allowed):
            found.append(f"{record.threadName}: {message}")
    return found


def check_future_callbacks(drivers: List[Driver], soak: Soak) -> None:
    for driver in drivers:
        added: Dict[str, str] = {}
        ran: Counter = Counter()
        for token, thread, how in driver.callbacks:
            if how == "added":
                added[token] = thread
                continue
            ran[token] += 1
            # Settled where callbacks run: the delivery thread, or the reading thread delivering a
            # small read in its stead (a blocking call is refused on both). Once closing,
            # whichever thread closes settles the pending futures.
            if how == "settled" and not soak.closing and thread not in ("where callbacks run", added[token]):
                soak.problem(f"future {token}: settled on {thread}, not where callbacks run")
        for token in added:
            if ran[token] != 1:
                soak.problem(f"future {token}: done-callback ran {ran[token]} times")


def notes_problem(sender: str, got: List[int], sent: Optional[int]) -> Optional[str]:
    """What is wrong with the sequence numbers delivered from ``sender``: not 0, 1, 2, ... in
    order, or (when ``sent`` is given) fewer than it sent; None if nothing."""
    for position, seq in enumerate(got):
        if seq != position:
            return (
                f"notes of {sender}: delivered ...{got[max(0, position - 3) : position + 5]}... at position {position}"
            )
    if sent is not None and len(got) != sent:
        return f"notes of {sender}: sent {sent}, delivered {len(got)}"
    return None


def linked_sides(soak: Soak) -> Tuple[Side, Side]:
    ours, theirs = memory_pair()
    a = Side("a", Connection(ours, name="a"), soak)
    b = Side("b", Connection(theirs, name="b"), soak)
    soak.sides = {"a": a, "b": b}
    return a, b


def make_drivers(sides: Tuple[Side, Side], soak: Soak) -> List[Driver]:
    deadline = time.monotonic() + TRAFFIC_SECONDS
    return [Driver(side, n, soak, deadline) for side in sides for n in range(DRIVERS_PER_SIDE)]


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
@pytest.mark.timeout(40)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.slow
def test_random_traffic_both_ways_keeps_every_promise(seed, caplog):
    soak = Soak(seed, closing=False)
    a, b = linked_sides(soak)
    try:
        a.connection.start()
        b.connection.start()
        drivers = make_drivers((a, b), soak)
        threads = run_drivers(drivers, on_main=drivers[0])  # a0 calls from the main thread
        for thread in threads:
            thread.join(WAIT * 3)
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"seed {seed}: drivers still running: {hung}\n{soak.report()}"

        # Cancelled and timed-out requests may still be running on the far side: wait for them.
        handled_all = wait_until(lambda: soak.handled == soak.sent)
        settled = wait_until(
            lambda: not any(s.connection._core.pending_ids() or s.connection._incoming.running() for s in (a, b))
        )
        wait_until(  # every notification delivered (checked below, with what went wrong)
            lambda: all(
                len(soak.sides[driver.side.peer].notes.get(driver.name, [])) == driver.seq for driver in drivers
            )
        )
    finally:
        a.connection.close()
        b.connection.close()

    if not handled_all:
        extra = soak.handled - soak.sent
        missing = soak.sent - soak.handled
        soak.problem(f"handlers ran other than once per request: extra {dict(extra)}, never {dict(missing)}")
    if not settled:
        soak.problem(
            "left pending: "
            + ", ".join(
                f"{s.name}: calls {s.connection._core.pending_ids()}, requests {s.connection._incoming.running()}"
                for s in (a, b)
            )
        )
    for driver in drivers:
        wrong = notes_problem(driver.name, soak.sides[driver.side.peer].notes.get(driver.name, []), driver.seq)
        if wrong:
            soak.problem(wrong)
    check_future_callbacks(drivers, soak)
    for text in unexpected_errors(caplog, soak):
        soak.problem(f"logged: {text}")
    assert not soak.problems, soak.report()
    assert sum(d.seq for d in drivers) > 0 and soak.operations > 0, f"seed {seed}: no traffic at all"


@pytest.mark.timeout(40)
@pytest.mark.parametrize("seed, closer", list(zip(SEEDS, ["a", "b", "handler"])))
def test_closing_one_side_mid_traffic_ends_every_call(seed, closer, caplog):
    """``closer``: the side whose main-thread close() comes first, or "handler": b closes itself
    from inside a handler of a request a sent."""
    soak = Soak(seed, closing=True)
    close_after = random.Random(f"{seed}-close").randint(20, 800)
    a, b = linked_sides(soak)
    sides = {"a": a, "b": b}
    try:
        a.connection.start()
        b.connection.start()
        drivers = make_drivers((a, b), soak)
        threads = run_drivers(drivers, on_main=None)
        wait_until(lambda: soak.operations >= close_after or all(d.done.is_set() for d in drivers))
        if closer == "handler":
            # b closes itself from inside a handler; a meets the end of the stream.
            token = "main-close"
            soak.sending("b", token)
            future = a.connection.call_future("soak/close", {"token": token})
            try:
                outcome = future.result(WAIT)
                assert outcome == {"token": token}, f"seed {seed}: soak/close answered {outcome!r}"
            except ConnectionClosed:
                pass
        else:
            sides[closer].connection.close()
        for thread in threads:
            thread.join(WAIT * 3)
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"seed {seed}: drivers still running after the close ({closer}): {hung}\n{soak.report()}"
    finally:
        a.connection.close()
        b.connection.close()

    for side in (a, b):
        if side.connection._core.pending_ids():
            soak.problem(f"{side.name}: calls left pending after close: {side.connection._core.pending_ids()}")
        if not side.connection.closed:
            soak.problem(f"{side.name}: not closed")
    if any(count > 1 for count in soak.handled.values()):
        soak.problem(f"a handler ran twice: {[k for k, c in soak.handled.items() if c > 1]}")
    if soak.handled - soak.sent:
        soak.problem(f"handlers ran for requests never sent: {dict(soak.handled - soak.sent)}")
    for driver in drivers:
        wrong = notes_problem(driver.name, soak.sides[driver.side.peer].notes.get(driver.name, []), None)
        if wrong:
            soak.problem(wrong)
    check_future_callbacks(drivers, soak)
    for text in unexpected_errors(caplog, soak):
        soak.problem(f"logged: {text}")
    assert not soak.problems, soak.report() + f" (closed by {closer} after {close_after} operations)"
