"""An event's workflow drawn as an inline SVG: its parents, the event, its children
(docs/WORKFLOWS.md, "Dependencies"), each node a link to its event page (a batch's node,
a member's child or a callback's parent, to the batch's page).

Drawn here like the charts (:mod:`delayq.dashboard.charts`): no library, nothing fetched by
the browser; every text from Redis is escaped. Each side shows at most :data:`MAX_SIDE`
nodes and says how many more there are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from ..batches import BATCH_TYPE

__all__ = ["MAX_SIDE", "Node", "Workflow"]

MAX_SIDE = 50
"""The most parents, and the most children, drawn."""

_COL_W, _GAP = 180, 45  # node width, space between columns (the SVG scales to its box)
_ROW, _NODE_H = 42, 34  # a node: its label over its state
_CHARS = 28  # a label's length before it is cut (the whole one is the node's tooltip)

# a state as a CSS class: the stylesheet colours it
_CLASS = {
    "ok": "good",
    "ready": "good",
    "in_flight": "good",
    "failed": "bad",
    "dead": "bad",
    "cancelled": "bad",
    "skipped": "bad",
    "vanished": "bad",
    "pending": "wait",
    "scheduled": "wait",
    "waiting": "wait",
    # a batch's (a member's child, a callback's parent)
    "done": "good",
    "open": "wait",
    "stuck": "bad",
}


@dataclass(frozen=True, slots=True)
class Node:
    """One event of the graph."""

    type_name: str
    id: str
    state: str  # a parent's status for its child, else the event's state


@dataclass(frozen=True, slots=True)
class Workflow:
    """An event with its parents and children (at most :data:`MAX_SIDE` of each drawn)."""

    event: Node
    parents: Sequence[Node]
    more_parents: int
    children: Sequence[Node]
    more_children: int

    def svg(self, url: Callable[..., str]) -> Markup:
        """The graph as SVG markup; ``url(path, **params)`` makes the event pages' links."""
        parents, children = self.parents[:MAX_SIDE], self.children[:MAX_SIDE]
        left = len(parents) + (1 if self.more_parents else 0)
        right = len(children) + (1 if self.more_children else 0)
        rows = max(left, right, 1)
        height = rows * _ROW + 8
        mid = height / 2
        # the columns used: parents, the event, children
        xs = (0, _COL_W + _GAP if parents else 0, (_COL_W + _GAP) * (2 if parents else 1))
        width = (xs[2] if children or self.more_children else xs[1]) + _COL_W
        title = f"workflow of {self.event.type_name} {self.event.id}"
        out = [
            f'<svg class="workflow" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" '
            f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        ]

        def top(n: int, count: int) -> float:  # a column's rows are centred on the event
            return mid - count * _ROW / 2 + n * _ROW + (_ROW - _NODE_H) / 2

        def node(x: float, y: float, n: Node, role: str) -> None:
            batch = n.type_name == BATCH_TYPE  # a batch: its own page
            label = f"batch {n.id}" if batch else f"{n.type_name} {n.id}"
            short = label if len(label) <= _CHARS else label[: _CHARS - 1] + "…"
            css = _CLASS.get(n.state, "other")
            href = url("/batch", id=n.id) if batch else url("/event", type=n.type_name, id=n.id)
            out.append(
                f'<a class="node {role}" href="{escape(href)}" data-state="{_safe(n.state)}">'
                f"<title>{escape(label)}: {escape(n.state)}</title>"
                f'<rect class="{css}" x="{x}" y="{y:.1f}" width="{_COL_W}" height="{_NODE_H}" rx="4"/>'
                f'<text x="{x + 6}" y="{y + 14:.1f}">{escape(short)}</text>'
                f'<text class="st" x="{x + 6}" y="{y + 28:.1f}">'
                f"{escape(n.state.replace('_', ' '))}</text></a>"
            )

        def more(x: float, y: float, count: int, what: str) -> None:
            out.append(
                f'<text class="more" x="{x + 6}" y="{y + 20:.1f}">and {count:,} more {what}</text>'
            )

        ey = mid - _NODE_H / 2
        for i in range(len(parents)):
            y = top(i, left) + _NODE_H / 2
            out.append(f'<line x1="{_COL_W}" y1="{y:.1f}" x2="{xs[1]}" y2="{mid:.1f}"/>')
        for i in range(len(children)):
            y = top(i, right) + _NODE_H / 2
            out.append(f'<line x1="{xs[1] + _COL_W}" y1="{mid:.1f}" x2="{xs[2]}" y2="{y:.1f}"/>')
        for i, p in enumerate(parents):
            node(xs[0], top(i, left), p, "parent")
        if self.more_parents:
            more(xs[0], top(len(parents), left), self.more_parents, "parents")
        node(xs[1], ey, self.event, "self")
        for i, c in enumerate(children):
            node(xs[2], top(i, right), c, "child")
        if self.more_children:
            more(xs[2], top(len(children), right), self.more_children, "children")
        out.append("</svg>")
        return Markup("".join(out))


def _safe(state: str) -> str:
    """A state as an attribute value of letters and underscores only."""
    return re.sub(r"[^a-z_]", "", state)
