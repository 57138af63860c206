"""The report of :func:`~delayq.spark.enqueue_dataframe` and of each streaming micro-batch."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

__all__ = ["EnqueueReport"]


@dataclass(frozen=True)
class EnqueueReport:
    """What :func:`enqueue_dataframe` did.

    ``scheduled + kept + replaced + rejected`` equals ``rows`` unless the input
    changed between the validation pass and the write pass.
    """

    event_type: str
    """Wire name of the event type."""
    rows: int
    """Rows in the DataFrame (counted by the validation pass)."""
    scheduled: int
    """Events added (due in the future, or straight to ready when already due)."""
    kept: int
    """Rows whose id already existed: the stored event was kept (``replace=False``)."""
    replaced: int
    """Rows whose id already existed and replaced the stored event (``replace=True``)."""
    rejected: int
    """Rows that failed validation; none of them was written."""
    written: bool
    """False when ``strict=True`` and some rows were rejected: nothing was written."""
    rejects: DataFrame | None
    """The rejected rows (columns ``id``, ``reason``, ``row_json``), unless written to a path.

    Persisted (memory and disk) when non-empty; call ``rejects.unpersist()`` when done.
    """
    rejects_path: str | None
    """Where the rejects were written as Parquet, if a path was given."""
    seconds: float
    """Wall-clock time of the whole call."""
    validation_seconds: float = 0.0
    """Part of :attr:`seconds` spent in the validation pass."""
    skipped: int = 0
    """Streaming sink only: rows not written because the sink's ledger holds their id
    for this batch already (the batch ran before, a task was retried, or an earlier
    row of the batch has the id). Always 0 for :func:`enqueue_dataframe`."""
    batch_id: int | None = None
    """Streaming sink only: the micro-batch id (None for :func:`enqueue_dataframe`)."""

    @property
    def rows_per_second(self) -> float:
        """Rows handled per second of wall-clock time."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        """A short human-readable summary."""
        batch = "" if self.batch_id is None else f", batch {self.batch_id}"
        lines = [
            f"delayq enqueue report for {self.event_type!r}{batch}",
            f"  rows       {self.rows:>12,}",
            f"  scheduled  {self.scheduled:>12,}",
            f"  kept       {self.kept:>12,}  (already there)",
            f"  replaced   {self.replaced:>12,}",
            f"  rejected   {self.rejected:>12,}",
            *(
                [f"  skipped    {self.skipped:>12,}  (already written in this batch)"]
                if self.batch_id is not None
                else []
            ),
            f"  seconds    {self.seconds:>12.2f}  ({self.rows_per_second:,.0f} rows/s; "
            f"validation {self.validation_seconds:.2f})",
        ]
        if not self.written:
            lines.append("  NOTHING WRITTEN: strict=True and some rows were rejected")
        if self.rejects_path:
            lines.append(f"  rejects written to {self.rejects_path}")
        return "\n".join(lines)
