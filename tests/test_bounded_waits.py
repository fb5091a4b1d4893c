"""Every wait has its bound: a call's timeout covers sending its request, and close(timeout)
covers the whole close, the agent process's stop included, even with the agent frozen."""

import os
import signal
import sys
import time

import pytest
from test_peer_errors import EXAMPLES, WAIT, Printer

from acp_lite import RemoteAgent
from acp_lite.errors import CallTimeout

pytestmark = pytest.mark.timeout(60)


def frozen_agent() -> RemoteAgent:
    """The example agent, initialized, then stopped with SIGSTOP: it reads nothing any more."""
    agent = RemoteAgent.spawn([sys.executable, os.path.join(EXAMPLES, "agent.py")], Printer())
    try:
        agent.initialize(timeout=WAIT)
    except BaseException:
        agent.close()
        raise
    assert agent.process is not None
    os.kill(agent.process.pid, signal.SIGSTOP)
    return agent


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
@pytest.mark.slow
def test_a_call_timeout_covers_sending_a_request_the_agent_does_not_read():
    agent = frozen_agent()
    try:
        started = time.monotonic()
        with pytest.raises(CallTimeout):
            agent.ext_method("_x/big", {"data": "x" * (4 * 1024 * 1024)}, timeout=0.5)  # more than the pipes hold
        assert time.monotonic() - started < 1.5
    finally:
        agent.close(timeout=1.0)


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_close_timeout_covers_stopping_a_frozen_agent():
    agent = frozen_agent()
    with pytest.raises(CallTimeout):  # its request is left stuck in the pipe, being written
        agent.ext_method("_x/big", {"data": "x" * (4 * 1024 * 1024)}, timeout=0.1)
    started = time.monotonic()
    agent.close(timeout=1.0)
    assert time.monotonic() - started < 1.5
