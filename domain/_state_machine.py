"""Declarative workflow state machines, validated once and then trusted.

A definition is checked completely when it is built, so code that moves a
workflow only has to ask ``assert_transition``: no instance of
``StateMachine`` can hold an unknown state, a dead end, an unreachable state
or a terminal state that leads anywhere. ``version`` hashes the canonical
form, so a host can pin the exact graph a workflow started under and notice
when a stored definition has changed.

Rules enforced at definition time, each raising ``InvalidDefinition`` that
names the offending state(s):

* the machine name and every state name match ``[a-z][a-z0-9_]{0,63}``, so
  they are safe to log, index and embed in keys;
* the state set is not empty;
* every state referenced as initial, terminal, transition source or target
  is a known state (states are given explicitly, or derived as the
  transition sources plus the terminal states);
* terminal states have no outgoing transitions;
* no state transitions to itself, because a no-op move would look like
  progress in the audit trail;
* every non-terminal state has at least one outgoing transition, because a
  dead end that is not terminal would strand a workflow forever;
* the initial state is not terminal, because such a machine can never run;
* every state is reachable from the initial state.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Self, TypedDict

from flowvault.domain._canonical import content_hash
from flowvault.domain._errors import InvalidDefinition, InvalidInput, InvalidTransition

__all__ = ["DEFAULT_LIFECYCLE", "StateMachine", "StateMachineJson"]

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,63}")
_IDENTIFIER_RULE = "[a-z][a-z0-9_]{0,63}"
_JSON_KEYS = frozenset({"name", "initial", "states", "terminal", "transitions"})
_SHOWN_NAMES = 8
_SHOWN_CHARS = 80


class StateMachineJson(TypedDict):
    """The canonical JSON form of a definition, exactly as hashed into ``version``."""

    name: str
    initial: str
    states: list[str]
    terminal: list[str]
    transitions: dict[str, list[str]]


def _clip(value: object) -> str:
    """Bound caller-supplied names so a hostile input cannot bloat messages or logs.

    A value that is not text is named by its type: its ``repr`` may be huge,
    recurse without end, or refuse (an integer past the digit limit).
    """
    text = value if isinstance(value, str) else f"<{type(value).__name__}>"
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _show(value: object) -> str:
    return repr(_clip(value))


def _listing(names: Iterable[str]) -> str:
    ordered = sorted(names)
    shown = ", ".join(_show(name) for name in ordered[:_SHOWN_NAMES])
    hidden = len(ordered) - _SHOWN_NAMES
    return f"{shown} and {hidden} more" if hidden > 0 else shown


def _failure(machine: str, problem: str, states: Iterable[str]) -> InvalidDefinition:
    ordered = sorted(states)
    return InvalidDefinition(
        f"state machine {_show(machine)}: {problem}: {_listing(ordered)}",
        machine=_clip(machine),
        states=_clip(",".join(ordered)),
    )


def _as_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidDefinition(f"{what} must be a string, not {type(value).__name__}")
    return value


def _as_names(value: object, what: str) -> frozenset[str]:
    """Refuse a bare string, which would otherwise be read as a set of letters."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidDefinition(
            f"{what} must be a collection of state names, not {type(value).__name__}"
        )
    items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise InvalidDefinition(f"{what} holds a {type(item).__name__}, not a state name")
    return frozenset(items)


def _as_table(value: object) -> dict[str, frozenset[str]]:
    if not isinstance(value, Mapping):
        raise InvalidDefinition(
            f"transitions must map each state to its targets, not be a {type(value).__name__}"
        )
    table: dict[str, frozenset[str]] = {}
    for source, targets in value.items():
        state = _as_text(source, "a transitions key")
        table[state] = _as_names(targets, f"the targets of {_show(state)}")
    return table


def _check_names(name: str, states: frozenset[str]) -> None:
    if not _IDENTIFIER.fullmatch(name):
        raise InvalidDefinition(
            f"state machine name {_show(name)} does not match {_IDENTIFIER_RULE}",
            machine=_clip(name),
        )
    if not states:
        raise InvalidDefinition(f"state machine {_show(name)} has no states", machine=name)
    malformed = {state for state in states if not _IDENTIFIER.fullmatch(state)}
    if malformed:
        raise _failure(name, f"state names must match {_IDENTIFIER_RULE}", malformed)


def _check_references(
    name: str,
    initial: str,
    states: frozenset[str],
    terminal: frozenset[str],
    table: Mapping[str, frozenset[str]],
) -> None:
    referenced = {initial, *terminal, *table}
    for targets in table.values():
        referenced.update(targets)
    unknown = referenced - states
    if unknown:
        raise _failure(name, "unknown state(s) referenced", unknown)


def _check_edges(
    name: str,
    states: frozenset[str],
    terminal: frozenset[str],
    table: Mapping[str, frozenset[str]],
) -> None:
    leaving = {state for state in terminal if table.get(state)}
    if leaving:
        raise _failure(name, "terminal state(s) with outgoing transitions", leaving)
    looping = {state for state, targets in table.items() if state in targets}
    if looping:
        raise _failure(name, "state(s) that transition to themselves", looping)
    stuck = {state for state in states - terminal if not table.get(state)}
    if stuck:
        raise _failure(name, "non-terminal state(s) without outgoing transitions", stuck)


def _reachable(initial: str, table: Mapping[str, frozenset[str]]) -> set[str]:
    seen = {initial}
    pending = deque([initial])
    while pending:
        for target in table.get(pending.popleft(), frozenset()):
            if target not in seen:
                seen.add(target)
                pending.append(target)
    return seen


def _check_reachability(
    name: str,
    initial: str,
    states: frozenset[str],
    terminal: frozenset[str],
    table: Mapping[str, frozenset[str]],
) -> None:
    if initial in terminal:
        raise _failure(name, "the initial state is terminal", {initial})
    unreachable = states - _reachable(initial, table)
    if unreachable:
        raise _failure(name, "state(s) unreachable from the initial state", unreachable)


@dataclass(frozen=True, eq=False, repr=False)
class StateMachine:
    """An immutable, fully validated graph of workflow states and allowed moves."""

    name: str
    initial: str
    states: frozenset[str]
    terminal: frozenset[str]
    transitions: Mapping[str, frozenset[str]]

    def __post_init__(self) -> None:
        """Validate here so that even direct construction cannot yield a bad machine."""
        name = _as_text(self.name, "the state machine name")
        initial = _as_text(self.initial, "the initial state")
        states = _as_names(self.states, "states")
        terminal = _as_names(self.terminal, "terminal states")
        table = _as_table(self.transitions)
        _check_names(name, states)
        _check_references(name, initial, states, terminal, table)
        _check_edges(name, states, terminal, table)
        _check_reachability(name, initial, states, terminal, table)
        outgoing = {state: targets for state, targets in table.items() if state not in terminal}
        object.__setattr__(self, "states", states)
        object.__setattr__(self, "terminal", terminal)
        object.__setattr__(self, "transitions", MappingProxyType(outgoing))

    @classmethod
    def define(
        cls,
        *,
        name: str,
        initial: str,
        transitions: Mapping[str, Iterable[str]],
        terminal: Iterable[str],
        states: Iterable[str] | None = None,
    ) -> Self:
        """Build a machine from plain collections, deriving states when not listed.

        Without ``states``, the states are the transition sources plus the
        terminal states, so a typo in a target surfaces as an unknown state.
        """
        terminal_states = _as_names(terminal, "terminal states")
        table = _as_table(transitions)
        if states is None:
            declared = frozenset(table) | terminal_states
        else:
            declared = _as_names(states, "states")
        return cls(
            name=name,
            initial=initial,
            states=declared,
            terminal=terminal_states,
            transitions=table,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Self:
        """Rebuild a stored definition, re-validating it since storage is not trusted."""
        if not isinstance(data, Mapping):
            raise InvalidDefinition(
                f"a state machine definition must be an object, not {type(data).__name__}"
            )
        missing = _JSON_KEYS - data.keys()
        unexpected = {_clip(key) for key in data.keys() - _JSON_KEYS}
        if missing or unexpected:
            raise InvalidDefinition(
                "a state machine definition needs exactly the keys "
                f"{_listing(_JSON_KEYS)}; missing: {_listing(missing) or 'none'}; "
                f"unexpected: {_listing(unexpected) or 'none'}"
            )
        return cls.define(
            name=_as_text(data["name"], "the state machine name"),
            initial=_as_text(data["initial"], "the initial state"),
            transitions=_as_table(data["transitions"]),
            terminal=_as_names(data["terminal"], "terminal states"),
            states=_as_names(data["states"], "states"),
        )

    def to_json(self) -> StateMachineJson:
        """Return the canonical form: sorted lists, and rows only for non-terminal states."""
        return {
            "name": self.name,
            "initial": self.initial,
            "states": sorted(self.states),
            "terminal": sorted(self.terminal),
            "transitions": {
                state: sorted(targets) for state, targets in sorted(self.transitions.items())
            },
        }

    @cached_property
    def version(self) -> str:
        """Return ``sha256:<hex>`` of the canonical form, blind to input ordering."""
        return content_hash(self.to_json())

    def targets(self, state: str) -> frozenset[str]:
        """Return the states reachable in one move; raise ``InvalidInput`` if unknown."""
        self._require(state)
        return self.transitions.get(state, frozenset())

    def is_terminal(self, state: str) -> bool:
        """Tell whether ``state`` ends a workflow; raise ``InvalidInput`` if unknown."""
        self._require(state)
        return state in self.terminal

    def can_transition(self, current: str, target: str) -> bool:
        """Tell whether the move is allowed; unknown states are simply not allowed."""
        if not isinstance(current, str) or not isinstance(target, str):
            return False
        return target in self.transitions.get(current, frozenset())

    def assert_transition(self, current: str, target: str) -> None:
        """Raise ``InvalidTransition`` unless the move is allowed.

        Unknown states raise ``InvalidTransition`` too, so callers guarding a
        move handle one error whatever made the move impossible.
        """
        if self.can_transition(current, target):
            return
        unknown = [
            state
            for state in (current, target)
            if not isinstance(state, str) or state not in self.states
        ]
        if unknown:
            reason = f"unknown state {_show(unknown[0])}"
        elif current in self.terminal:
            reason = f"{_show(current)} is terminal"
        else:
            reason = f"{_show(current)} does not lead to {_show(target)}"
        raise InvalidTransition(
            f"state machine {_show(self.name)} forbids {_show(current)} -> {_show(target)}: "
            f"{reason}",
            current=_clip(current),
            target=_clip(target),
            machine=self.name,
        )

    def _require(self, state: str) -> None:
        if not isinstance(state, str) or state not in self.states:
            raise InvalidInput(
                f"state machine {_show(self.name)} has no state {_show(state)}",
                machine=self.name,
                state=_clip(state),
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StateMachine):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.version)

    def __repr__(self) -> str:
        return f"StateMachine(name={self.name!r}, version={self.version!r})"


DEFAULT_LIFECYCLE = StateMachine.define(
    name="default_lifecycle",
    initial="intake",
    transitions={
        "intake": {"planning", "cancelled", "failed", "stopped"},
        "planning": {"executing", "decision", "cancelled", "failed", "stopped"},
        "executing": {"decision", "completed", "failed", "cancelled", "stopped"},
        "decision": {"executing", "completed", "failed", "cancelled", "stopped"},
    },
    terminal={"completed", "failed", "cancelled", "stopped"},
)
"""The lifecycle every workflow follows unless its host supplies another.

A workflow arrives in ``intake``, is planned in ``planning``, runs in
``executing`` and pauses in ``decision`` while it awaits a human, who sends
it back to ``executing`` or ends it. It finishes in exactly one terminal
state: ``completed`` on success, ``failed`` on error, ``cancelled`` when a
person withdraws it, or ``stopped`` when the host halts it. Any live state
can fail, be cancelled or be stopped.
"""
