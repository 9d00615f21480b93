"""A call on a background thread whose exception resurfaces on the thread that collects it.

The dp exchanges (CocktailSGD, DiLoCo with a sync delay) and the asynchronous checkpoint writer
run one job at a time beside training; a failure there must stop training at the point that
needs the result, not die silently in a daemon thread.
"""
import threading
from typing import Any, Callable, Optional


class BackgroundCall:
    """fn(*args) on a daemon thread, started at construction.

    wait() joins; result() joins and returns fn's value, or raises
    RuntimeError(f"{what}: {error}") from the error fn raised (once: a second result() after
    a raise returns None).
    """

    def __init__(self, what: str, fn: Callable, *args, name: Optional[str] = None):
        self.what = what
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name=name)
        self._thread.start()

    def _run(self, fn, args) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:   # handed to the collecting thread by result()
            self._error = e

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"{self.what}: {err}") from err
        return self._value
