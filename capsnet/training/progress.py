"""A tqdm progress bar over an epoch's examples, driven by the loops' on_progress callback."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def epoch_progress(enabled: bool, epoch: int,
                   total: int | None) -> Iterator[Callable[[int, float, float], None] | None]:
    """Yields on_progress(examples_done, mean_loss, accuracy) updating a bar, or None."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=f"epoch {epoch}", unit="img", leave=False, dynamic_ncols=True)

    def update(done: int, loss: float, accuracy: float) -> None:
        bar.update(done - bar.n)
        bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.4f}")

    try:
        yield update
    finally:
        bar.close()
