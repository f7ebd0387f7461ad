"""Waiting for a part's thread when the part stops, whatever point its start reached.

A program here stops on SIGINT by KeyboardInterrupt, raised in the main thread wherever it is. If that
is inside ``Thread.start()`` (which waits for the new thread to say it runs), the part holds a thread
that ``join`` refuses ("cannot join thread before it is started"); a stop that joins it would raise
RuntimeError from the cleanup and hide the interrupt, so the program exits 1 instead of 130 and skips
the rest of its cleanup. Every stop waits through :func:`join_started`.
"""

from __future__ import annotations

import threading


def join_started(thread: threading.Thread | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``thread`` to end; True when it is not running afterwards.

    Nothing to wait for (True at once): None, a thread never started or whose start was interrupted
    (its loop sees the part's stop flag if it still comes up), or one already ended. The calling
    thread itself is not waited for (a part stopped from its own thread): False.
    """
    if thread is None:
        return True
    if thread is threading.current_thread():
        return False
    if thread.is_alive():  # False before the thread has signalled that it started: join() would raise
        thread.join(timeout_s)
    return not thread.is_alive()
