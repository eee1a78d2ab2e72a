"""Ctrl-C must stop a search whatever it is doing, also when the search was started with SIGINT
ignored: a shell starts a background job (`cmd &` without job control) with SIGINT set to SIG_IGN, the
process inherits it, and Python keeps an inherited SIG_IGN instead of installing its own handler, so a
SIGINT sent to the search did nothing and it ran to its end."""

from __future__ import annotations

import signal
import threading


def take_ctrl_c() -> None:
    """Make SIGINT raise KeyboardInterrupt in this process again if it was started ignoring it (from
    the main thread only, where Python delivers signals). The search's workers and estimator ignore it
    themselves: the search stops them."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
