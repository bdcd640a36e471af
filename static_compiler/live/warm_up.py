"""One warm-up for every front door (`warm` on the compiled set, the served
artifact and the torch backend): a Future when it runs in the background.
numpy and the standard library only: the serving binary and a torch-only
process import it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable

from static_compiler.support.decode_types import WarmReport


def in_background(run: Callable[[], WarmReport], name: str) -> concurrent.futures.Future:
    """`run()` on a daemon thread: a Future of its report at once (its
    `result()` waits, and raises what the warm-up raised)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(run())
            except BaseException as err:  # handed to whoever waits on the future
                future.set_exception(err)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future
