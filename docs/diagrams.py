"""MkDocs hook: diagrams drawn from the code when the site is built, as inline SVG (no script, no network).

``<!-- diagram: transaction-states -->`` on a page becomes the state diagram of
``redis_txmq.core.states.TRANSITIONS``: the states as rounded boxes in layers, every move an arrow labelled with what
makes it. The table is the one the dead-letter resolution and the protocol model test read, so the picture cannot
drift from the code. A page naming a diagram that does not exist fails the build.

The layout is a small layered one (Sugiyama's steps, simplified): moves that go back up are turned round to rank the
states, every state gets the rank of its longest path from a first state, a move's label sits in a rank of its own
between two ranks of states (so labels and boxes never overlap), the order within a rank follows the mean position of
the neighbours, and each item is pulled towards its neighbours while keeping its distance from the next.
"""

from __future__ import annotations

import html
import importlib
import itertools
import math
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"<!--\s*diagram:\s*([\w-]+)\s*-->")

FONT = 14
"""Size of a state's name (px)."""
LABEL_FONT = 12
"""Size of a move's label (px)."""
CHAR = 0.55
"""Average glyph width of the sans-serif fonts, in em: boxes sized with it hold their text in the usual fonts."""
LINE = 15
"""Height of a label line (px)."""
BASELINE = 0.35
"""From a line's middle down to its baseline, in em (what every renderer agrees on, unlike dominant-baseline)."""
WRAP = 20
"""Characters per label line."""
BOX_HEIGHT = 40
BOX_PAD = 20
"""Space either side of a state's name in its box."""
GAP = 20
"""Least horizontal space between two items of a rank (px)."""
RANK_GAP = 30
"""Vertical space between two ranks (px)."""
LOOP = 34
"""How far a move from a state to itself reaches out of the box (px)."""
MARGIN = 12
SEARCH = 20_000
"""Up to this many orders of the ranks, all are tried; beyond, neighbours are swapped while that helps."""


@dataclass
class Item:
    """One thing in a rank: a state's box, a move's label (the move passes through ``x``), or a bend of a long move."""

    rank: int
    left: float
    """Extent left of ``x``."""
    right: float
    """Extent right of ``x``."""
    height: float
    node: int | None = None
    lines: tuple[str, ...] = ()
    neighbours: list[Item] = field(default_factory=list)
    x: float = 0.0
    y: float = 0.0
    rank_height: float = 0.0


@dataclass(frozen=True)
class Graph:
    """What a diagram shows: named states and labelled moves between them (indexes into ``names``)."""

    title: str
    names: tuple[str, ...]
    moves: tuple[tuple[int, int, str], ...]


def wrap(label: str) -> tuple[str, ...]:
    return tuple(textwrap.wrap(label, WRAP, break_long_words=False, break_on_hyphens=False)) or ("",)


def text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR


def label_width(lines: tuple[str, ...]) -> float:
    return max(text_width(line, LABEL_FONT) for line in lines)


def back_moves(graph: Graph) -> set[int]:
    """The moves that close a cycle (found depth first from the states nothing enters, in table order): turned
    round for ranking, so the states are ranked on a graph without cycles."""
    n = len(graph.names)
    entered = {t for s, t, _ in graph.moves if s != t}
    starts = [v for v in range(n) if v not in entered] + [v for v in range(n) if v in entered]
    state = [0] * n  # 0 unseen, 1 on the path, 2 done
    back: set[int] = set()

    def visit(v: int) -> None:
        state[v] = 1
        for index, (s, t, _) in enumerate(graph.moves):
            if s != v or s == t:
                continue
            if state[t] == 1:
                back.add(index)
            elif state[t] == 0:
                visit(t)
        state[v] = 2

    for v in starts:
        if state[v] == 0:
            visit(v)
    return back


def layout(graph: Graph) -> tuple[list[list[Item]], list[tuple[int, list[Item], bool, str]], list[tuple[int, str]]]:
    """The ranks of items (positioned), every move as (index, the items it passes, drawn upwards) and the moves
    from a state to itself."""
    n = len(graph.names)
    back = back_moves(graph)
    loops = [(s, label) for s, t, label in graph.moves if s == t]
    ranked = [(index, (t, s) if index in back else (s, t)) for index, (s, t, _) in enumerate(graph.moves) if s != t]

    level = [0] * n
    for _ in range(n):  # longest path: n rounds settle any graph without cycles of n states
        for _, (a, b) in ranked:
            level[b] = max(level[b], level[a] + 1)

    boxes = []
    for v, name in enumerate(graph.names):
        width = text_width(name, FONT) + 2 * BOX_PAD
        right, height = width / 2, float(BOX_HEIGHT)
        for s, label in loops:
            if s == v:
                lines = wrap(label)
                right += LOOP + 6 + label_width(lines)
                height = max(height, len(lines) * LINE + 8)
        boxes.append(Item(rank=2 * level[v], left=width / 2, right=right, height=height, node=v))

    ranks: list[list[Item]] = [[] for _ in range(2 * max(level) + 1)]
    for box in boxes:
        ranks[box.rank].append(box)
    paths = []
    for index, (a, b) in ranked:
        chain = [boxes[a]]
        for rank in range(boxes[a].rank + 1, boxes[b].rank):
            if rank == boxes[a].rank + 1:
                lines = wrap(graph.moves[index][2])
                item = Item(rank, left=4, right=8 + label_width(lines), height=len(lines) * LINE + 6, lines=lines)
            else:
                item = Item(rank, left=4, right=4, height=8)
            ranks[rank].append(item)
            chain.append(item)
        chain.append(boxes[b])
        for upper, lower in itertools.pairwise(chain):
            upper.neighbours.append(lower)
            lower.neighbours.append(upper)
        paths.append((index, chain, index in back, graph.moves[index][2]))

    order(ranks)
    place(ranks)
    return ranks, paths, loops


def order(ranks: list[list[Item]]) -> None:
    """Within each rank, items by the mean position of their neighbours in the rank above, then below (stable)."""

    def sweep(sequence: list[list[Item]], towards: int) -> None:
        for rank in sequence:
            position = {id(item): i for i, item in enumerate(ranks[rank[0].rank + towards])}
            keys = {}
            for here, item in enumerate(rank):
                seen = [position[id(o)] for o in item.neighbours if id(o) in position]
                keys[id(item)] = sum(seen) / len(seen) if seen else here
            rank.sort(key=lambda item: keys[id(item)])

    for _ in range(4):
        sweep([r for r in ranks[1:] if r], -1)
        sweep([r for r in reversed(ranks[:-1]) if r], +1)
    if math.prod(math.factorial(len(rank)) for rank in ranks) <= SEARCH:
        fewest_crossings(ranks)
        return
    for _ in range(len(ranks) * 4):  # then swap neighbours while that removes crossings
        swapped = False
        for r, rank in enumerate(ranks):
            for i in range(len(rank) - 1):
                before = crossings(ranks, r)
                rank[i], rank[i + 1] = rank[i + 1], rank[i]
                if crossings(ranks, r) < before:
                    swapped = True
                else:
                    rank[i], rank[i + 1] = rank[i + 1], rank[i]
        if not swapped:
            break


def fewest_crossings(ranks: list[list[Item]]) -> None:
    """Every order of every rank tried (small diagrams only): the fewest crossings, then the least reordering of
    the mean-position order, which keeps the table's order where nothing else decides."""
    start = [list(rank) for rank in ranks]
    best: tuple[int, int] | None = None
    chosen = start
    for candidate in itertools.product(*(itertools.permutations(rank) for rank in start)):
        trial = [list(rank) for rank in candidate]
        crossed = sum(crossings(trial, r) for r in range(0, len(trial), 2))
        moved = sum(
            1
            for rank, was in zip(trial, start, strict=True)
            for i in range(len(rank))
            for j in range(i + 1, len(rank))
            if was.index(rank[i]) > was.index(rank[j])
        )
        if best is None or (crossed, moved) < best:
            best, chosen = (crossed, moved), trial
    for rank, order in zip(ranks, chosen, strict=True):
        rank[:] = order


def crossings(ranks: list[list[Item]], r: int) -> int:
    """Crossing moves between rank ``r`` and its neighbours above and below."""
    total = 0
    for upper, lower in ((r - 1, r), (r, r + 1)):
        if upper < 0 or lower >= len(ranks):
            continue
        below = {id(item): i for i, item in enumerate(ranks[lower])}
        segments = [(i, below[id(o)]) for i, item in enumerate(ranks[upper]) for o in item.neighbours if id(o) in below]
        total += sum(1 for a, b in segments for c, d in segments if a < c and b > d)
    return total


def place(ranks: list[list[Item]]) -> None:
    """x: every item pulled to the mean of its neighbours, keeping order and distance; y: ranks stacked."""
    for rank in ranks:
        x = 0.0
        for i, item in enumerate(rank):
            x = x + (rank[i - 1].right + GAP + item.left if i else 0)
            item.x = x
    for _ in range(12):
        for rank in ranks:
            wanted = [sum(o.x for o in it.neighbours) / len(it.neighbours) if it.neighbours else it.x for it in rank]
            lowest = []
            for i, item in enumerate(rank):
                floor = lowest[i - 1] + rank[i - 1].right + GAP + item.left if i else float("-inf")
                lowest.append(max(wanted[i], floor))
            highest = [0.0] * len(rank)
            for i in range(len(rank) - 1, -1, -1):
                item = rank[i]
                ceiling = highest[i + 1] - rank[i + 1].left - GAP - item.right if i + 1 < len(rank) else float("inf")
                highest[i] = min(wanted[i], ceiling)
            for i, item in enumerate(rank):
                item.x = (lowest[i] + highest[i]) / 2
    left = min(item.x - item.left for rank in ranks for item in rank)
    y = MARGIN
    for rank in ranks:
        height = max((item.height for item in rank), default=0)
        for item in rank:
            item.x += MARGIN - left
            item.y = y + height / 2
            item.rank_height = height
        y += height + RANK_GAP


def ports(paths: list[tuple[int, list[Item], bool, str]]) -> dict[tuple[int, int], float]:
    """Where each move leaves or enters a box: spread along its bottom (or top), in the order of where they go."""
    sides: dict[tuple[int, str], list[tuple[float, int, int]]] = {}
    for index, chain, _, _ in paths:
        sides.setdefault((id(chain[0]), "bottom"), []).append((chain[1].x, index, 0))
        sides.setdefault((id(chain[-1]), "top"), []).append((chain[-2].x, index, len(chain) - 1))
    boxes = {id(chain[end]): chain[end] for _, chain, _, _ in paths for end in (0, -1)}
    found = {}
    for (box_id, _), uses in sides.items():
        box = boxes[box_id]
        uses.sort()
        step = min(22.0, 1.2 * box.left / max(len(uses) - 1, 1))
        for i, (_, index, end) in enumerate(uses):
            found[(index, end)] = box.x + (i - (len(uses) - 1) / 2) * step
    return found


def svg(graph: Graph, ident: str) -> str:
    ranks, paths, loops = layout(graph)
    items = [item for rank in ranks for item in rank]
    width = max(item.x + item.right for item in items) + MARGIN
    height = max(item.y + item.height / 2 for item in items) + MARGIN
    where = ports(paths)
    boxes = {item.node: item for item in items if item.node is not None}
    entered = {t for s, t, _ in graph.moves if s != t}
    left = {s for s, t, _ in graph.moves if s != t}
    arrow = f"{ident}-arrow"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="diagram" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-labelledby="{ident}-title {ident}-desc" '
        'style="max-width:100%;height:auto">',
        f'<title id="{ident}-title">{html.escape(graph.title)}</title>',
        f'<desc id="{ident}-desc">'
        + html.escape("; ".join(f"{graph.names[s]} to {graph.names[t]}: {label}" for s, t, label in graph.moves))
        + "</desc>",
        f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>',
    ]
    for index, chain, upwards, _ in paths:
        first, last = chain[0], chain[-1]
        points = [(where[(index, 0)], first.y + first.height / 2)]
        for item in chain[1:-1]:  # straight down through a rank: the bends are between ranks, clear of labels
            points += [(item.x, item.y - item.rank_height / 2), (item.x, item.y + item.rank_height / 2)]
        points.append((where[(index, len(chain) - 1)], last.y - last.height / 2))
        if upwards:
            points.reverse()
        d = f"M{points[0][0]:.1f},{points[0][1]:.1f}"
        for (x1, y1), (x2, y2) in itertools.pairwise(points):
            if x1 == x2:
                d += f" L{x2:.1f},{y2:.1f}"
            else:
                middle = (y1 + y2) / 2
                d += f" C{x1:.1f},{middle:.1f} {x2:.1f},{middle:.1f} {x2:.1f},{y2:.1f}"
        out.append(f'<path d="{d}" fill="none" stroke="currentColor" stroke-width="1.3" marker-end="url(#{arrow})"/>')
        label = chain[1]
        out.append(text(label.x + 8, label.y, label.lines, "start"))
    for v, label in loops:
        box = boxes[v]
        edge = box.x + box.left
        d = f"M{edge:.1f},{box.y - 9:.1f} C{edge + LOOP:.1f},{box.y - 30:.1f} {edge + LOOP:.1f},{box.y + 30:.1f} "
        d += f"{edge + 1:.1f},{box.y + 9:.1f}"
        out.append(f'<path d="{d}" fill="none" stroke="currentColor" stroke-width="1.3" marker-end="url(#{arrow})"/>')
        out.append(text(edge + LOOP + 6, box.y, wrap(label), "start"))
    for v, box in boxes.items():
        w = 2 * box.left
        x, y = box.x - box.left, box.y - BOX_HEIGHT / 2
        dashed = ' stroke-dasharray="5 4"' if v not in entered else ""
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_HEIGHT}" rx="12" fill="currentColor" '
            f'fill-opacity="0.06" stroke="currentColor" stroke-width="1.5"{dashed}/>'
        )
        if v not in left:  # a final state: a double border
            out.append(
                f'<rect x="{x + 4:.1f}" y="{y + 4:.1f}" width="{w - 8:.1f}" height="{BOX_HEIGHT - 8}" rx="9" '
                'fill="none" stroke="currentColor" stroke-width="1"/>'
            )
        out.append(
            f'<text x="{box.x:.1f}" y="{box.y + BASELINE * FONT:.1f}" font-size="{FONT}" font-weight="bold" '
            f'text-anchor="middle" fill="currentColor">{html.escape(graph.names[v])}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def text(x: float, y: float, lines: tuple[str, ...], anchor: str) -> str:
    top = y - (len(lines) - 1) * LINE / 2 + BASELINE * LABEL_FONT
    spans = "".join(
        f'<tspan x="{x:.1f}" y="{top + i * LINE:.1f}">{html.escape(line)}</tspan>' for i, line in enumerate(lines)
    )
    return f'<text font-size="{LABEL_FONT}" text-anchor="{anchor}" fill="currentColor">{spans}</text>'


def transaction_states() -> Graph:
    """``redis_txmq.core.states``, read when the site is built: every state that a move names, every move."""
    states = importlib.import_module("redis_txmq.core.states")
    used = [s for s in states.State if any(s in (t.source, t.target) for t in states.TRANSITIONS)]
    index = {state: i for i, state in enumerate(used)}
    moves = tuple((index[t.source], index[t.target], t.by) for t in states.TRANSITIONS)
    return Graph("A transaction's life", tuple(str(s.value) for s in used), moves)


DIAGRAMS = {"transaction-states": transaction_states}
"""Marker name -> what draws it."""


def figure(name: str) -> str:
    if name not in DIAGRAMS:
        raise PluginError(f"<!-- diagram: {name} -->: no such diagram; known: {', '.join(sorted(DIAGRAMS))}")
    return f'<figure class="diagram">\n{svg(DIAGRAMS[name](), f"diagram-{name}")}\n</figure>'


def on_page_content(html_text: str, page: Any, **kwargs: Any) -> str:
    return MARKER.sub(lambda match: figure(match.group(1)), html_text)
