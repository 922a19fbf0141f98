"""A point-to-point send's states without processes or sockets: the moves its table allows, the words
of a timeout in each, and late news of a send already done."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce.p2p.records import MOVES, Send, SendState


def _send() -> Send:
    return Send(dest=1, tag=5, number=3, data=np.ones(4, np.float32))


def test_an_announced_send_moves_through_its_states_and_says_what_it_waits_for():
    send = _send()
    assert send.state is SendState.CONNECTING
    assert send.waiting() == "waiting to connect to rank 1"
    send.move(SendState.SENDING)
    assert send.waiting() == "waiting to send to rank 1"
    send.move(SendState.ANNOUNCED)
    assert send.waiting() == "waiting for rank 1 to post a matching receive"
    send.move(SendState.SENDING)  # cleared: the payload follows
    send.finish()
    assert send.state is SendState.DONE and send.partner() == 1


def test_a_move_the_table_does_not_allow_is_refused():
    send = _send()
    assert SendState.ANNOUNCED not in MOVES[SendState.CONNECTING]
    with pytest.raises(RuntimeError, match="send #3 to rank 1 .tag 5. cannot go from connecting to announced"):
        send.move(SendState.ANNOUNCED)


def test_news_of_a_send_already_done_changes_nothing():
    send = _send()
    send.finish()
    send.move(SendState.ANNOUNCED)  # its frame left as the group closed: the send failed already
    assert send.state is SendState.DONE
