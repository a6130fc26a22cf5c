"""A seeded generator of GSM-style arithmetic word problems whose solutions can be written many ways.

Each problem follows one quantity through a chain of events (find, lose, buy packs, share, ...) in one
of several scenario families, and is written in GSM8K format: one solution line per operation with a
calculator annotation ``<<a+b=c>>``, then ``#### <answer>``.  The numbers are fixed by the plan; the
words are not: each solution line picks a sentence shape, a connective ("So", "Thus", "Then", ...),
the order of commutative operands and whether the holder is named or a pronoun, and each problem picks
a format ("$5" or "5 dollars", "Step 1:" or plain lines, "3 + 4" or "3+4", a final period, thousands
commas).  A model trained on this text therefore meets positions where several next tokens are equally
right (where MARS may relax) and positions -- the numbers -- where exactly one is.

Guarantees: integers only; every stated amount, intermediate and final value is >= 2 (no negative or
empty quantities, so plurals always read right); division only when exact; values stay within
``Difficulty.max_value``.  ``steps`` records every operation (``a op b = value``, its kind and the
phrasing chosen) so a test can recompute the answer.  Deterministic for a seed: one
``random.Random(seed)`` drives everything, and ``generate_problems(n, s)`` is a prefix of
``generate_problems(n + m, s)``.

Left out on purpose: fractions, percentages, units that convert (hours to minutes), problems with two
interacting quantities, and a large vocabulary -- the text is meant for a tiny BPE tokenizer and a
~10M-parameter model trained on a CPU (under 300 distinct words in all).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .prompt import SYSTEM_PROMPT, prompt_messages, render_prompt

__all__ = [
    "PRESETS",
    "SYSTEM_PROMPT",
    "Difficulty",
    "family_names",
    "generate_problems",
    "prompt_messages",
    "render_prompt",
]


@dataclass(frozen=True)
class Difficulty:
    """How hard the generated problems are: how many operations and how large the numbers."""

    min_steps: int = 2  # fewest solution lines (operations) per problem
    max_steps: int = 4  # most solution lines; a "buy k packs of m" event takes two
    max_number: int = 100  # largest start amount or amount added / removed stated in a question
    max_factor: int = 10  # largest group count, multiplier ("k packs") and divisor ("k friends")
    max_value: int = 1000  # cap on every intermediate value and the answer
    allow_multiplication: bool = True  # packs of m, "twice as many"
    allow_division: bool = True  # halves, equal shares

    def __post_init__(self):
        if self.min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {self.min_steps}")
        if self.max_steps < self.min_steps:
            raise ValueError(f"max_steps must be >= min_steps ({self.min_steps}), got {self.max_steps}")
        if self.max_number < 10:
            raise ValueError(f"max_number must be >= 10, got {self.max_number}")
        if self.max_factor < 2:
            raise ValueError(f"max_factor must be >= 2, got {self.max_factor}")
        if self.max_value < 2 * self.max_number:
            raise ValueError(
                f"max_value must be >= 2 * max_number ({2 * self.max_number}), got {self.max_value}"
            )

    @classmethod
    def preset(cls, name: str) -> Difficulty:
        """One of ``PRESETS`` by name."""
        if name not in PRESETS:
            raise ValueError(f"difficulty: unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name]


PRESETS: dict[str, Difficulty] = {
    "easy": Difficulty(
        min_steps=1, max_steps=2, max_number=20, max_factor=5, max_value=100, allow_division=False
    ),
    "default": Difficulty(),
    "hard": Difficulty(min_steps=4, max_steps=7, max_number=1000, max_factor=12, max_value=100_000),
}


# ----------------------------------------------------------------------------------------------------
# The plan: numbers only
# ----------------------------------------------------------------------------------------------------


class _Event(NamedTuple):
    kind: str  # a key of _KINDS
    k: int  # amount added / removed, factor, divisor or group count
    m: int  # amount per group (the *_groups kinds), else 0
    after: int  # the quantity once the event has happened


def _group_bound(d: Difficulty) -> int:
    """Largest amount per group: small for small numbers, a fifth of max_number for large ones."""
    return max(d.max_factor, d.max_number // 5)


def _divisors(v: int, d: Difficulty) -> list[int]:
    return [k for k in range(2, min(d.max_factor, v // 2) + 1) if v % k == 0]


def _gain(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    hi = min(d.max_number, d.max_value - v)
    if hi < 2:
        return None
    a = rng.randint(2, hi)
    return _Event("gain", a, 0, v + a)


def _keep(v: int) -> int:
    """Least that a loss leaves of ``v``: a third of it, so chains do not collapse to 2 or 3."""
    return max(2, v // 3)


def _lose(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    hi = min(d.max_number, v - _keep(v))
    if hi < 2:
        return None
    a = rng.randint(2, hi)
    return _Event("lose", a, 0, v - a)


def _gain_groups(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    room = d.max_value - v
    k_hi = min(d.max_factor, room // 2)
    if not d.allow_multiplication or k_hi < 2:
        return None
    k = rng.randint(2, k_hi)
    m = rng.randint(2, min(_group_bound(d), room // k))
    return _Event("gain_groups", k, m, v + k * m)


def _lose_groups(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    room = v - _keep(v)
    k_hi = min(d.max_factor, room // 2)
    if not d.allow_multiplication or k_hi < 2:
        return None
    k = rng.randint(2, k_hi)
    m = rng.randint(2, min(_group_bound(d), room // k))
    return _Event("lose_groups", k, m, v - k * m)


def _times(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    k_hi = min(4, d.max_factor, d.max_value // v)  # "twice", "three times", "four times"
    if not d.allow_multiplication or k_hi < 2:
        return None
    k = rng.randint(2, k_hi)
    return _Event("times", k, 0, v * k)


def _half(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    if not d.allow_division or v % 2 or v < 4:
        return None
    return _Event("half", 2, 0, v // 2)


def _split(rng: random.Random, v: int, d: Difficulty, kind: str = "split") -> _Event | None:
    ks = _divisors(v, d) if d.allow_division else []
    if not ks:
        return None
    k = rng.choice(ks)
    return _Event(kind, k, 0, v // k)


def _share(rng: random.Random, v: int, d: Difficulty) -> _Event | None:
    return _split(rng, v, d, kind="share")


class _Kind(NamedTuple):
    draw: Callable[[random.Random, int, Difficulty], _Event | None]
    lines: int  # solution lines the event takes
    weight: int  # relative chance of being picked among the feasible kinds


_KINDS: dict[str, _Kind] = {
    "gain": _Kind(_gain, 1, 3),
    "lose": _Kind(_lose, 1, 3),
    "gain_groups": _Kind(_gain_groups, 2, 2),
    "lose_groups": _Kind(_lose_groups, 2, 2),
    "times": _Kind(_times, 1, 1),
    "half": _Kind(_half, 1, 1),
    "split": _Kind(_split, 1, 1),
    "share": _Kind(_share, 1, 2),  # the last event only: the question asks for one share
}


def _plan(rng: random.Random, kinds: tuple[str, ...], d: Difficulty) -> tuple[int, list[_Event]]:
    """A start amount and events whose solution lines total a number in [min_steps, max_steps].

    A kind is drawn among those the family writes, that fit in the lines left and whose numbers work
    out from the current value; "gain" or "lose" always fits (max_value >= 2 * max_number).
    """
    n_lines = rng.randint(d.min_steps, d.max_steps)
    v = rng.randint(max(4, d.max_number // 10), d.max_number)
    start, events, used = v, [], 0
    while used < n_lines:
        left = n_lines - used
        options = [name for name in kinds if _KINDS[name].lines <= left and (name != "share" or left == 1)]
        weights = [_KINDS[name].weight for name in options]
        while True:
            name = rng.choices(options, weights)[0]
            event = _KINDS[name].draw(rng, v, d)
            if event is not None:
                break
            i = options.index(name)
            del options[i], weights[i]
        events.append(event)
        used += _KINDS[name].lines
        v = event.after
    return start, events


# ----------------------------------------------------------------------------------------------------
# The words: scenario families
# ----------------------------------------------------------------------------------------------------


class _Q(NamedTuple):
    """One way to state an event in the question, with phrases that refer back to it ("after ...")."""

    text: str
    after: tuple[str, ...]
    group: str = ""  # what the k groups are called ("packs", "hours") in the product line


@dataclass(frozen=True)
class _Family:
    """The words of one scenario.  Templates use str.format slots:

    {name} {h} (name or pronoun) {his} {him} {item} {qs} {qa} {qm} (amounts with their unit) {s} {a}
    {k} {m} (bare numbers) {tw} ("twice") {grp} {goods} {thing}; solution templates add {X} (the
    computation with its unit), {E} (without) and {R} (the result with its unit).
    """

    units: tuple[str, ...]  # the counted things (plural), one drawn per problem; empty for money
    start: tuple[str, ...]
    events: dict[str, tuple[_Q, ...]]  # kind -> ways to state it in the question
    state: tuple[str, ...]  # clauses "the quantity is {X}"; {left} is " left" after a loss
    products: dict[str, tuple[str, ...]]  # *_groups kind -> lines computing k * m
    ask: tuple[str, ...]  # the final question when the last event is not a share
    share: tuple[tuple[str, tuple[str, ...]], ...]  # (final question, answer lines) for a share
    remaining: bool = False  # the quantity is what is left (a trip): every state line says "left"


_ITEM_SHARE = (
    (
        "{h} shares them equally among {k} friends. How many {item} does each friend get?",
        ("each friend gets {X}", "{E}, so each friend gets {R}", "every friend gets {X}"),
    ),
    (
        "If {h} puts them equally into {k} boxes, how many {item} go in each box?",
        ("each box gets {X}", "{E}, so each box has {R}", "there are {X} in each box"),
    ),
)

_FAMILIES: dict[str, _Family] = {
    "collecting": _Family(
        units=(
            "stickers",
            "marbles",
            "shells",
            "stamps",
            "cards",
            "beads",
        ),
        start=(
            "{name} has {qs}.",
            "{name} has a collection of {qs}.",
            "There are {qs} in {name}'s collection.",
            "{name} collects {item} and has {s} of them.",
        ),
        events={
            "gain": (
                _Q("{h} finds {a} more {item}.", ("finding {a} more", "the {a} new {item}")),
                _Q("A friend gives {him} {qa}.", ("the gift of {qa}", "getting {a} more")),
                _Q("{h} gets {qa} as a gift.", ("the gift", "getting {qa}")),
            ),
            "lose": (
                _Q("{h} gives {qa} to {his} brother.", ("giving {a} away", "the gift to {his} brother")),
                _Q("{h} loses {qa}.", ("losing {a}", "losing {qa}")),
                _Q("{h} gives away {qa}.", ("giving away {qa}", "giving {a} away")),
            ),
            "gain_groups": (
                _Q("{h} buys {k} packs of {m} {item}.", ("buying the packs",), "packs"),
                _Q("{h} buys {k} packs with {m} {item} in each pack.", ("buying them",), "packs"),
                _Q("{h} gets {k} boxes, and each box has {m} {item}.", ("getting the boxes",), "boxes"),
            ),
            "lose_groups": (
                _Q("{h} gives {m} {item} to each of {k} friends.", ("giving them away",), "friends"),
                _Q("{h} gives {k} friends {m} {item} each.", ("the gifts",), "friends"),
                _Q("Each of {k} friends gets {m} {item} from {him}.", ("giving them away",), "friends"),
            ),
            "times": (
                _Q("A month later {h} has {tw} as many {item}.", ("a month",)),
                _Q("{his} collection grows to {tw} its size.", ("the collection grows",)),
                _Q("By the end of the year, {h} has {tw} as many {item} as before.", ("a year",)),
            ),
            "half": (
                _Q("{h} gives half of {his} {item} to {his} sister.", ("giving half away",)),
                _Q("{h} loses half of them.", ("losing half",)),
                _Q("{h} gives away half of {his} {item}.", ("giving half away", "giving away half")),
            ),
            "split": (
                _Q("{h} puts them into {k} equal piles and keeps one pile.", ("keeping one pile",)),
                _Q("{h} splits them equally into {k} boxes and keeps one box.", ("keeping one box",)),
                _Q("{h} sorts them into {k} equal groups and keeps only one group.", ("keeping one group",)),
            ),
        },
        state=(
            "{h} has {X}{left}",
            "there are {X}{left} in {his} collection",
            "{his} collection has {X}{left}",
        ),
        products={
            "gain_groups": ("the {k} {grp} hold {X}", "{h} gets {X}", "{E}, so the {grp} hold {R}"),
            "lose_groups": ("the {k} {grp} get {X}", "{h} gives away {X}", "{E}, so {h} gives away {R}"),
        },
        ask=(
            "How many {item} does {name} have now?",
            "How many {item} does {h} have in the end?",
            "How many {item} are in {his} collection now?",
        ),
        share=_ITEM_SHARE,
    ),
    "shopping": _Family(
        units=(),
        start=(
            "{name} has {qs}.",
            "{name} goes to the store with {qs}.",
            "{name} has saved {qs}.",
            "{name} has {qs} in {his} wallet.",
        ),
        events={
            "gain": (
                _Q("{h} earns {qa} more.", ("earning {qa}", "earning {qa} more")),
                _Q("{his} mom gives {him} {qa}.", ("getting {qa} from {his} mom", "the gift of {qa}")),
                _Q("{h} gets {qa} for helping a neighbor.", ("getting {qa}", "helping the neighbor")),
            ),
            "lose": (
                _Q("{h} spends {qa} on a book.", ("buying the book", "spending {qa}")),
                _Q("{h} pays {qa} for lunch.", ("paying for lunch", "spending {qa} on lunch")),
                _Q("{h} buys a {thing} for {qa}.", ("buying the {thing}", "paying {qa}")),
            ),
            "gain_groups": (
                _Q("{h} works for {k} hours and earns {qm} per hour.", ("working",), "hours"),
                _Q("{h} earns {qm} a day for {k} days.", ("those days",), "days"),
                _Q("For {k} days {h} earns {qm} each day.", ("those days",), "days"),
            ),
            "lose_groups": (
                _Q("{h} buys {k} {goods} that cost {qm} each.", ("buying the {goods}",), "{goods}"),
                _Q("{h} buys {k} {goods} at {qm} each.", ("paying for the {goods}",), "{goods}"),
                _Q("Each {good} costs {qm}, and {h} buys {k} of them.", ("buying them",), "{goods}"),
            ),
            "half": (
                _Q("{h} spends half of {his} money on a gift.", ("buying the gift", "spending half")),
                _Q("{h} puts half of the money in the bank.", ("putting half in the bank",)),
                _Q("{h} gives half of it to {his} brother.", ("giving half away",)),
            ),
        },
        state=("{h} has {X}{left}", "{h} ends up with {X}{left}", "there is {X}{left} in {his} wallet"),
        products={
            "gain_groups": ("{h} earns {X}", "in {k} {grp} {h} earns {X}", "{E}, so {h} earns {R}"),
            "lose_groups": (
                "the {k} {grp} cost {X}",
                "{h} pays {X} for the {grp}",
                "{E}, so the {grp} cost {R}",
            ),
        },
        ask=(
            "How much money does {name} have now?",
            "How much money does {h} have left?",
            "How many dollars does {name} have in the end?",
            "How much money is left?",
        ),
        share=(
            (
                "{h} shares the money equally among {k} friends. How much does each friend get?",
                ("each friend gets {X}", "{E}, so each friend gets {R}", "every friend gets {X}"),
            ),
            (
                "If {h} splits the money equally into {k} bags, how much goes in each bag?",
                ("each bag gets {X}", "{E}, so each bag has {R}", "there is {X} in each bag"),
            ),
        ),
    ),
    "baking": _Family(
        units=(
            "cookies",
            "muffins",
            "cupcakes",
            "rolls",
            "pies",
        ),
        start=(
            "{name} bakes {qs}.",
            "{name} has {qs} on a plate.",
            "There are {qs} in {name}'s kitchen.",
            "{name} makes {qs} for a party.",
        ),
        events={
            "gain": (
                _Q("{h} bakes {a} more.", ("baking {a} more", "baking {qa}")),
                _Q("A neighbor brings {qa}.", ("the {a} from the neighbor", "the neighbor brings {a}")),
                _Q("{h} makes another {qa}.", ("making {a} more", "making {qa}")),
            ),
            "lose": (
                _Q("{h} eats {qa}.", ("eating {a}", "eating {qa}")),
                _Q("{h} sells {qa}.", ("selling {a}", "selling {qa}")),
                _Q("{his} friends eat {qa}.", ("{his} friends eat {a}", "the friends eat {a}")),
            ),
            "gain_groups": (
                _Q("{h} bakes {k} trays with {m} {item} on each tray.", ("baking the trays",), "trays"),
                _Q("{h} bakes {k} more trays of {m} {item}.", ("baking them",), "trays"),
                _Q("{h} makes {k} batches of {m} {item}.", ("making the batches",), "batches"),
            ),
            "lose_groups": (
                _Q("{h} sells {k} boxes with {m} {item} in each box.", ("selling the boxes",), "boxes"),
                _Q(
                    "{h} fills {k} bags with {m} {item} each and gives them away.",
                    ("giving the bags away",),
                    "bags",
                ),
                _Q("{h} sells {k} boxes of {m} {item}.", ("selling them",), "boxes"),
            ),
            "half": (
                _Q("{h} sells half of them.", ("selling half",)),
                _Q("{h} gives half of the {item} to a friend.", ("giving half away",)),
                _Q("Half of the {item} are eaten at lunch.", ("lunch",)),
            ),
            "split": (
                _Q("{h} packs them into {k} equal boxes and keeps one box.", ("keeping one box",)),
                _Q("{h} splits them into {k} equal bags and keeps one bag.", ("keeping one bag",)),
                _Q(
                    "{h} puts them on {k} plates with the same number on each and keeps one plate.",
                    ("keeping one plate",),
                ),
            ),
        },
        state=("{h} has {X}{left}", "there are {X}{left}", "{h} ends up with {X}{left}"),
        products={
            "gain_groups": ("the {k} {grp} hold {X}", "{h} bakes {X}", "{E}, so the {grp} hold {R}"),
            "lose_groups": ("the {k} {grp} hold {X}", "{h} packs {X}", "{E}, so {R} go into the {grp}"),
        },
        ask=(
            "How many {item} does {name} have now?",
            "How many {item} are there in the end?",
            "How many {item} does {h} have at the end?",
        ),
        share=_ITEM_SHARE,
    ),
    "bus": _Family(
        units=("people",),
        start=("There are {qs} on a bus.", "A bus has {qs} on it.", "A bus leaves with {qs}."),
        events={
            "gain": (
                _Q("At the next stop, {qa} get on.", ("{a} people get on", "the stop")),
                _Q("Then {qa} more get on.", ("{a} more get on", "{a} people get on")),
                _Q("{qa} get on at the park.", ("the park", "{a} people get on")),
            ),
            "lose": (
                _Q("At the next stop, {qa} get off.", ("{a} people get off", "the stop")),
                _Q("{qa} get off at the school.", ("the school", "{a} people get off")),
                _Q("Then {a} people leave the bus.", ("{a} people leave", "{a} people get off")),
            ),
            "gain_groups": (
                _Q("{k} families of {m} people get on.", ("the families get on",), "families"),
                _Q("{k} groups with {m} people in each group get on.", ("the groups get on",), "groups"),
                _Q(
                    "At the mall, {k} families get on, with {m} people in each family.",
                    ("the mall",),
                    "families",
                ),
            ),
            "lose_groups": (
                _Q("{k} groups of {m} people get off at the zoo.", ("the zoo",), "groups"),
                _Q("{k} families with {m} people each get off.", ("the families get off",), "families"),
                _Q("At the school, {k} groups of {m} people get off.", ("the school",), "groups"),
            ),
            "half": (
                _Q("Half of the people get off at the park.", ("the park", "half of them get off")),
                _Q("At the next stop, half of the people get off.", ("half of them get off",)),
                _Q("Then half of them leave the bus.", ("half of them leave",)),
            ),
        },
        state=("there are {X}{left} on the bus", "the bus has {X}{left}", "the bus has {X}{left} on it"),
        products={
            "gain_groups": ("the {k} {grp} have {X}", "{X} get on", "{E}, so {R} get on"),
            "lose_groups": ("the {k} {grp} have {X}", "{X} get off", "{E}, so {R} get off"),
        },
        ask=(
            "How many people are on the bus now?",
            "How many people are on the bus at the end?",
            "How many people are still on the bus?",
        ),
        share=(
            (
                "At the zoo they split into {k} equal groups. How many people are in each group?",
                ("each group has {X}", "{E}, so each group has {R}", "there are {X} in each group"),
            ),
            (
                "If they sit equally in {k} rows, how many people sit in each row?",
                ("each row has {X}", "{E}, so {R} sit in each row", "there are {X} in each row"),
            ),
        ),
    ),
    "travel": _Family(
        units=("km", "miles"),
        start=(
            "{name} is going on a trip of {qs}.",
            "A trip is {qs} long, and {name} is driving it.",
            "{name} has to drive {qs} to see {his} aunt.",
        ),
        events={
            "gain": (
                _Q(
                    "The road is closed, so the trip gets {qa} longer.", ("the road is closed", "adding {qa}")
                ),
                _Q("{h} takes a longer road that adds {qa}.", ("taking the longer road", "adding {qa}")),
                _Q("{h} makes a stop that adds {qa} to the trip.", ("the stop", "adding {qa}")),
            ),
            "lose": (
                _Q("{h} drives {qa} before lunch.", ("driving {qa}", "lunch")),
                _Q("On the first day {h} drives {qa}.", ("the first day", "driving {qa}")),
                _Q("{h} drives {qa} and stops for gas.", ("driving {qa}", "the stop")),
            ),
            "lose_groups": (
                _Q("{h} drives {qm} an hour for {k} hours.", ("those hours",), "hours"),
                _Q("{h} drives for {k} hours at {qm} per hour.", ("driving",), "hours"),
                _Q("For {k} days {h} drives {qm} a day.", ("those days",), "days"),
            ),
            "half": (
                _Q("{h} drives half of the distance that is left.", ("driving half",)),
                _Q("By noon {h} has driven half of what is left.", ("the morning", "driving half")),
                _Q("{h} drives half of the rest and stops for the night.", ("the first half",)),
            ),
        },
        state=("{h} has {X}{left}", "{h} still has {X} to go", "the trip has {X}{left}"),
        products={
            "lose_groups": ("in {k} {grp} {h} drives {X}", "{h} drives {X}", "{E}, so {h} drives {R}"),
        },
        ask=(
            "How far does {name} still have to drive?",
            "How many {item} does {h} have left to drive?",
            "How many {item} are left?",
        ),
        share=(
            (
                "If {h} drives the rest in {k} days, the same distance each day, "
                "how far does {h} drive each day?",
                ("{h} drives {X} each day", "{E}, so {h} drives {R} a day", "each day {h} drives {X}"),
            ),
            (
                "{h} wants to split the rest into {k} equal parts. How long is each part?",
                ("each part is {X}", "{E}, so each part is {R}", "every part is {X}"),
            ),
        ),
        remaining=True,
    ),
    "garden": _Family(
        units=("flowers", "plants", "roses", "trees"),
        start=(
            "{name} has {qs} in {his} garden.",
            "There are {qs} in {name}'s garden.",
            "{name} grows {qs}.",
        ),
        events={
            "gain": (
                _Q("{h} plants {a} more.", ("planting {a} more", "planting {qa}")),
                _Q("{h} buys {qa} and plants them.", ("buying {a} more", "planting {qa}")),
                _Q("{his} friend gives {him} {qa}.", ("the gift of {qa}", "getting {a} more")),
            ),
            "lose": (
                _Q("{h} picks {qa} for a friend.", ("picking {a}", "picking {qa}")),
                _Q("Rabbits eat {qa}.", ("the rabbits eat {a}", "losing {a}")),
                _Q("{qa} die in the heat.", ("{a} of them die", "losing {a}")),
            ),
            "gain_groups": (
                _Q("{h} plants {k} rows of {m} {item}.", ("planting the rows",), "rows"),
                _Q("{h} plants {k} more rows with {m} {item} in each row.", ("planting them",), "rows"),
                _Q(
                    "{h} buys {k} boxes with {m} {item} in each box and plants them all.",
                    ("planting them",),
                    "boxes",
                ),
            ),
            "times": (
                _Q("By summer {h} has {tw} as many {item}.", ("the summer",)),
                _Q("The number of {item} grows to {tw} as many.", ("the garden grows",)),
                _Q("A year later the garden has {tw} as many {item}.", ("a year",)),
            ),
            "half": (
                _Q("Half of the {item} die in the cold.", ("the cold", "losing half")),
                _Q("{h} gives half of them to {his} neighbor.", ("giving half away",)),
                _Q("Rabbits eat half of the {item}.", ("the rabbits eat half",)),
            ),
            "split": (
                _Q(
                    "{h} splits the garden into {k} equal parts and gives away all but one part.",
                    ("keeping one part",),
                ),
                _Q("{h} moves them into {k} equal rows and keeps only one row.", ("keeping one row",)),
                _Q("{h} divides them among {k} equal beds and keeps one bed.", ("keeping one bed",)),
            ),
        },
        state=("{h} has {X}{left}", "there are {X}{left} in the garden", "the garden has {X}{left}"),
        products={
            "gain_groups": ("the {k} {grp} have {X}", "{h} plants {X}", "{E}, so the {grp} have {R}"),
        },
        ask=(
            "How many {item} does {name} have now?",
            "How many {item} are in the garden now?",
            "How many {item} are there at the end?",
        ),
        share=(
            (
                "{h} gives them equally to {k} friends. How many {item} does each friend get?",
                ("each friend gets {X}", "{E}, so each friend gets {R}", "every friend gets {X}"),
            ),
            (
                "{h} plants them in {k} equal rows. How many {item} are in each row?",
                ("each row has {X}", "{E}, so each row has {R}", "there are {X} in each row"),
            ),
        ),
    ),
}

_NAMES = (
    ("Lily", "she", "her", "her"),
    ("Emma", "she", "her", "her"),
    ("Mia", "she", "her", "her"),
    ("Anna", "she", "her", "her"),
    ("Sara", "she", "her", "her"),
    ("Nora", "she", "her", "her"),
    ("Ella", "she", "her", "her"),
    ("Zoe", "she", "her", "her"),
    ("Tom", "he", "his", "him"),
    ("Sam", "he", "his", "him"),
    ("Ben", "he", "his", "him"),
    ("Max", "he", "his", "him"),
    ("Leo", "he", "his", "him"),
    ("Jack", "he", "his", "him"),
    ("Noah", "he", "his", "him"),
    ("Owen", "he", "his", "him"),
)
_GOODS = (
    ("pens", "pen"),
    ("notebooks", "notebook"),
    ("apples", "apple"),
    ("tickets", "ticket"),
    ("cups", "cup"),
)
_THINGS = ("hat", "toy", "lamp", "game", "ball")
_TIMES_WORDS = {2: "twice", 3: "three times", 4: "four times"}

# Connectives by the line's role. Any is right, so a model sees a genuine near-tie at the line start.
_FIRST = ("", "First,", "To start,")
_NEXT = ("", "Then", "Next,", "Now")
_CONSEQUENCE = ("", "So", "Thus", "Then")
_FINAL = ("", "So", "Thus", "Therefore", "In the end,")
_LABELS = ("", "Step {i}: ")
# Sentence shapes of a line that changes the quantity: the state clause with the computation in it,
# with "after <event>" before or after it, or the computation first and ", so" the state.
_STATE_SHAPES = ("{STATE_X}", "after {ev}, {STATE_X}", "{E}, so {STATE_R}", "{STATE_X} after {ev}")
_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b,
}


def _kinds_of(family: str) -> tuple[str, ...]:
    """The event kinds a family can write: those it has question templates for, and a final share."""
    return tuple(k for k in _KINDS if k in _FAMILIES[family].events or k == "share")


def family_names() -> tuple[str, ...]:
    """The scenario families the generator draws from."""
    return tuple(_FAMILIES)


# ----------------------------------------------------------------------------------------------------
# Rendering a plan
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Style:
    """Per-problem formatting choices: all equally correct ways to write the same solution."""

    label: str  # "" or "Step {i}: " before each line
    spaced: bool  # "3 + 4 = 7" or "3+4=7"
    times_sign: str  # how "*" is shown outside the annotation: "*" or "x"
    dollars: bool  # money as "5 dollars" (True) or "$5"
    commas: bool  # thousands commas in the text ("1,200"); never inside <<...>> or after ####
    period: bool  # solution lines end with "."

    @classmethod
    def draw(cls, rng: random.Random) -> _Style:
        return cls(
            label=rng.choice(_LABELS),
            spaced=rng.random() < 0.7,
            times_sign=rng.choice(("*", "x")),
            dollars=rng.random() < 0.5,
            commas=rng.random() < 0.5,
            period=rng.random() < 0.7,
        )


class _Writer:
    """Formats numbers, amounts and operation lines for one problem."""

    def __init__(self, style: _Style, unit: str | None):
        self.style, self.unit = style, unit  # unit None: money

    def num(self, x: int) -> str:
        return f"{x:,}" if self.style.commas else str(x)

    def qty(self, x: int) -> str:
        """An amount with its unit: "$5", "5 dollars", "5 stickers"."""
        if self.unit is None:
            return f"{self.num(x)} dollars" if self.style.dollars else f"${self.num(x)}"
        return f"{self.num(x)} {self.unit}"

    def op(self, a: int, sign: str, b: int, r: int) -> tuple[str, str, str]:
        """(E, X, R) for ``a sign b = r``: bare computation, computation with unit, result with unit."""
        shown = self.style.times_sign if sign == "*" else sign
        eq = " = " if self.style.spaced else "="
        lhs = (
            f"{self.num(a)} {shown} {self.num(b)}"
            if self.style.spaced
            else f"{self.num(a)}{shown}{self.num(b)}"
        )
        ann = f"<<{a}{sign}{b}={r}>>"
        e = f"{lhs}{eq}{ann}{self.num(r)}"
        if self.unit is None and not self.style.dollars:
            x = f"{lhs}{eq}${ann}{self.num(r)}"
        elif self.unit is None:
            x = f"{e} dollars"
        else:
            x = f"{e} {self.unit}"
        return e, x, self.qty(r)


def _sentence(*parts: str) -> str:
    text = " ".join(p for p in parts if p)
    return text[:1].upper() + text[1:]


class _Renderer:
    """Writes one plan: the question sentences, the solution lines and their ``steps`` records."""

    def __init__(self, rng: random.Random, family: str, start: int, n_lines: int, style: _Style):
        self.rng, self.fam, self.style, self.n_lines = rng, _FAMILIES[family], style, n_lines
        name, self.he, his, him = rng.choice(_NAMES)
        unit = rng.choice(self.fam.units) if self.fam.units else None
        goods, good = rng.choice(_GOODS)
        self.w = _Writer(style, unit)
        self.slots = {
            "name": name,
            "his": his,
            "him": him,
            "item": unit or "dollars",
            "goods": goods,
            "good": good,
            "thing": rng.choice(_THINGS),
            "s": self.w.num(start),
            "qs": self.w.qty(start),
        }
        self.question = [self.fill(rng.choice(self.fam.start))]
        self.lines: list[str] = []
        self.steps: list[dict[str, Any]] = []
        self.used: set[_Q] = set()

    def fill(self, template: str, **more: Any) -> str:
        """``template`` with the problem's slots; {h} is the name or the pronoun, drawn each time."""
        return template.format(**self.slots, h=self.rng.choice((self.he, self.slots["name"])), **more)

    def ask(self, ev: _Event) -> _Q | None:
        """States ``ev`` in the question (a way not used yet in this problem) and returns that way."""
        options = self.fam.events.get(ev.kind, ())
        if not options:
            return None
        q = self.rng.choice([o for o in options if o not in self.used] or options)
        self.used.add(q)
        self.question.append(self.fill(q.text, **self.amounts(ev)))
        return q

    def amounts(self, ev: _Event) -> dict[str, str]:
        w = self.w
        return {
            "k": w.num(ev.k),
            "m": w.num(ev.m),
            "a": w.num(ev.k),
            "qa": w.qty(ev.k),
            "qm": w.qty(ev.m),
            "tw": _TIMES_WORDS.get(ev.k, ""),
        }

    def emit(self, kind: str, a: int, sign: str, b: int, phrasing: str, body: str, role: tuple[str, ...]):
        """Appends a solution line (label, connective for its role, body) and its ``steps`` record."""
        if len(self.lines) == self.n_lines - 1:
            role = _FINAL
        elif not self.lines:
            role = _FIRST
        conn = self.rng.choice(role)
        text = _sentence(conn, body) + ("." if self.style.period else "")
        self.lines.append(self.style.label.format(i=len(self.lines) + 1) + text)
        self.steps.append(
            {
                "kind": kind,
                "op": sign,
                "a": a,
                "b": b,
                "value": _OPS[sign](a, b),
                "phrasing": phrasing,
                "connective": conn,
            }
        )

    def state_line(self, kind: str, a: int, sign: str, b: int, q: _Q, role: tuple[str, ...], amount: int = 0):
        """A line computing the new quantity, in one of ``_STATE_SHAPES`` x the family's state clauses."""
        e, x, r = self.w.op(a, sign, b, _OPS[sign](a, b))
        left = " left" if self.fam.remaining or sign in "-/" else ""
        shape_i, state_i = self.rng.randrange(len(_STATE_SHAPES)), self.rng.randrange(len(self.fam.state))
        shape, state = _STATE_SHAPES[shape_i], self.fam.state[state_i]
        body = shape.format(
            STATE_X=self.fill(state, X=x, left=left) if "STATE_X" in shape else "",
            STATE_R=self.fill(state, X=r, left=left) if "STATE_R" in shape else "",
            E=e,
            ev=self.fill(self.rng.choice(q.after), a=self.w.num(amount), qa=self.w.qty(amount))
            if "ev" in shape
            else "",
        )
        self.emit(kind, a, sign, b, f"{shape_i}.{state_i}", body, role)

    def swap(self, a: int, b: int) -> tuple[int, int]:
        """Commutative operands in either order (both are right): the usual one 70% of the time."""
        return (b, a) if self.rng.random() < 0.3 else (a, b)


def _say_change(r: _Renderer, ev: _Event, v: int) -> None:
    """gain / lose: one line, v + a or v - a."""
    q = r.ask(ev)
    a, b = r.swap(v, ev.k) if ev.kind == "gain" else (v, ev.k)
    r.state_line(ev.kind, a, "+" if ev.kind == "gain" else "-", b, q, _NEXT, amount=ev.k)


def _say_groups(r: _Renderer, ev: _Event, v: int) -> None:
    """gain_groups / lose_groups: k * m = p, then v + p or v - p."""
    q = r.ask(ev)
    p = ev.k * ev.m
    k, m = r.swap(ev.k, ev.m)
    e, x, res = r.w.op(k, "*", m, p)
    p_i = r.rng.randrange(len(r.fam.products[ev.kind]))
    grp = q.group.format(goods=r.slots["goods"])
    body = r.fill(r.fam.products[ev.kind][p_i], X=x, E=e, R=res, grp=grp, k=r.w.num(ev.k))
    r.emit(f"{ev.kind}.mul", k, "*", m, f"p.{p_i}", body, _NEXT)
    a, b = r.swap(v, p) if ev.kind == "gain_groups" else (v, p)
    r.state_line(f"{ev.kind}.total", a, "+" if ev.kind == "gain_groups" else "-", b, q, _CONSEQUENCE)


def _say_times(r: _Renderer, ev: _Event, v: int) -> None:
    """times: v * k ("twice as many")."""
    q = r.ask(ev)
    a, b = r.swap(v, ev.k)
    r.state_line(ev.kind, a, "*", b, q, _NEXT)


def _say_divide(r: _Renderer, ev: _Event, v: int) -> None:
    """half / split: v / k, the holder keeps one part."""
    q = r.ask(ev)
    r.state_line(ev.kind, v, "/", ev.k, q, _NEXT)


def _say_share(r: _Renderer, ev: _Event, v: int) -> None:
    """share (last event): the question asks for v / k, each part's size."""
    ask, answers = r.rng.choice(r.fam.share)
    r.question.append(r.fill(ask, **r.amounts(ev)))
    e, x, res = r.w.op(v, "/", ev.k, ev.after)
    s_i = r.rng.randrange(len(answers))
    r.emit("share", v, "/", ev.k, f"s.{s_i}", r.fill(answers[s_i], X=x, E=e, R=res), _NEXT)


_SAY: dict[str, Callable[[_Renderer, _Event, int], None]] = {
    "gain": _say_change,
    "lose": _say_change,
    "gain_groups": _say_groups,
    "lose_groups": _say_groups,
    "times": _say_times,
    "half": _say_divide,
    "split": _say_divide,
    "share": _say_share,
}


def _render(
    rng: random.Random, family: str, start: int, events: list[_Event], style: _Style
) -> tuple[str, str, list[dict[str, Any]]]:
    """(question, answer, steps) for a plan, every word choice drawn from ``rng``."""
    r = _Renderer(rng, family, start, sum(_KINDS[e.kind].lines for e in events), style)
    v = start
    for ev in events:
        _SAY[ev.kind](r, ev, v)
        v = ev.after
    if events[-1].kind != "share":
        r.question.append(r.fill(rng.choice(r.fam.ask)))
    answer = "\n".join([*r.lines, f"#### {v}"])
    return " ".join(_sentence(s) for s in r.question), answer, r.steps


def _difficulty(difficulty: Difficulty | str) -> Difficulty:
    if isinstance(difficulty, Difficulty):
        return difficulty
    if isinstance(difficulty, str):
        return Difficulty.preset(difficulty)
    raise ValueError(f"difficulty: expected a Difficulty or a preset name, got {type(difficulty).__name__}")


def generate_problems(n: int, seed: int, difficulty: Difficulty | str = "default") -> list[dict[str, Any]]:
    """``n`` problems, each a dict with ``question``, ``answer`` (GSM8K format), ``gold`` (the answer
    as a string), ``family`` and ``steps``: one dict per solution line, in order, with ``kind``, ``op``
    ("+", "-", "*", "/"), ``a``, ``b``, ``value`` (= a op b, exact), ``phrasing`` (which sentence shape
    was used) and ``connective`` (the word opening the line, "" for none).

    The same ``seed`` gives the same list; ``difficulty`` is a ``Difficulty`` or a key of ``PRESETS``.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {type(seed).__name__}")
    d = _difficulty(difficulty)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        family = rng.choice(tuple(_FAMILIES))
        start, events = _plan(rng, _kinds_of(family), d)
        question, answer, steps = _render(rng, family, start, events, _Style.draw(rng))
        out.append(
            {
                "question": question,
                "answer": answer,
                "gold": str(events[-1].after),
                "family": family,
                "steps": steps,
            }
        )
    return out
