"""Suite-wide pytest setup: the multi-host harness fixtures (tests/cluster/fixtures.py), and
SIGINT handled as in a terminal even when the suite was started with it ignored (`nohup`, a
background job of a script): the tests that press Ctrl-C on a CLI child would otherwise send
it to a process that inherited the ignoring."""

import signal

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = ["tests.cluster.fixtures"]
