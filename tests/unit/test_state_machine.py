from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowvault.domain._canonical import canonical_json, content_hash, parse_json
from flowvault.domain._errors import InvalidDefinition, InvalidInput, InvalidTransition
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE, StateMachine

LIFECYCLE_TABLE = {
    "intake": {"planning", "cancelled", "failed", "stopped"},
    "planning": {"executing", "decision", "cancelled", "failed", "stopped"},
    "executing": {"decision", "completed", "failed", "cancelled", "stopped"},
    "decision": {"executing", "completed", "failed", "cancelled", "stopped"},
}
LIFECYCLE_TERMINAL = {"completed", "failed", "cancelled", "stopped"}
LIFECYCLE_STATES = sorted(LIFECYCLE_TABLE.keys() | LIFECYCLE_TERMINAL)


def _small() -> StateMachine:
    return StateMachine.define(
        name="small",
        initial="start",
        transitions={"start": ["middle", "done"], "middle": ["done"]},
        terminal=["done"],
    )


def _refused(**kwargs: object) -> InvalidDefinition:
    with pytest.raises(InvalidDefinition) as caught:
        StateMachine.define(**kwargs)  # type: ignore[arg-type]
    assert caught.value.code == "INVALID_DEFINITION"
    return caught.value


def test_define_derives_states_from_transitions_and_terminal():
    """Derives the state set from transition sources plus terminal states."""
    machine = _small()
    assert machine.states == {"start", "middle", "done"}
    assert machine.terminal == {"done"}
    assert machine.initial == "start"
    assert machine.targets("start") == {"middle", "done"}


def test_explicit_states_matching_the_table_are_accepted():
    """Accepts an explicit state list that matches the table exactly."""
    machine = StateMachine.define(
        name="small",
        initial="start",
        transitions={"start": ["middle", "done"], "middle": ["done"]},
        terminal=["done"],
        states=["done", "middle", "start"],
    )
    assert machine == _small()


def test_terminal_row_without_targets_is_tolerated_and_normalised_away():
    """Treats an empty row for a terminal state as no row at all."""
    machine = StateMachine.define(
        name="small",
        initial="start",
        transitions={"start": ["middle", "done"], "middle": ["done"], "done": []},
        terminal=["done"],
    )
    assert machine.version == _small().version
    assert "done" not in machine.transitions


@pytest.mark.parametrize("name", ["", "Upper", "1st", "has-dash", "has space", "x" * 65])
def test_machine_name_must_be_a_plain_identifier(name):
    """Refuses a machine name that is not a short plain identifier."""
    error = _refused(name=name, initial="a", transitions={"a": ["b"]}, terminal=["b"])
    assert repr(name) in error.message


@pytest.mark.parametrize("bad", ["", "Start", "2nd", "with-dash", "tab\t", "é", "s" * 65])
def test_state_names_must_be_plain_identifiers(bad):
    """Refuses a state name that is empty or not a short plain identifier."""
    error = _refused(name="m", initial="a", transitions={"a": [bad]}, terminal=[bad])
    assert repr(bad) in error.message


def test_empty_state_set_is_refused():
    """Refuses a machine that declares no states at all."""
    error = _refused(name="empty", initial="a", transitions={}, terminal=[])
    assert "no states" in error.message
    assert "'empty'" in error.message


def test_unknown_target_is_refused():
    """Refuses a transition target that is not a known state."""
    error = _refused(name="m", initial="a", transitions={"a": ["b", "ghost"]}, terminal=["b"])
    assert "unknown" in error.message
    assert "'ghost'" in error.message
    assert error.details["states"] == "ghost"


def test_unknown_initial_is_refused():
    """Refuses an initial state that is not a known state."""
    error = _refused(name="m", initial="ghost", transitions={"a": ["b"]}, terminal=["b"])
    assert "unknown" in error.message
    assert "'ghost'" in error.message


def test_unknown_terminal_is_refused_when_states_are_explicit():
    """Refuses a terminal state missing from an explicit state list."""
    error = _refused(
        name="m", initial="a", transitions={"a": ["b"]}, terminal=["b", "ghost"], states=["a", "b"]
    )
    assert "unknown" in error.message
    assert "'ghost'" in error.message


def test_unknown_source_is_refused_when_states_are_explicit():
    """Refuses a transition source missing from an explicit state list."""
    error = _refused(
        name="m",
        initial="a",
        transitions={"a": ["b"], "ghost": ["b"]},
        terminal=["b"],
        states=["a", "b"],
    )
    assert "unknown" in error.message
    assert "'ghost'" in error.message


def test_terminal_state_with_outgoing_edges_is_refused():
    """Refuses a terminal state that has outgoing transitions."""
    error = _refused(name="m", initial="a", transitions={"a": ["b"], "b": ["a"]}, terminal=["b"])
    assert "terminal" in error.message
    assert "'b'" in error.message


def test_self_transition_is_refused():
    """Refuses a state that transitions to itself."""
    error = _refused(name="m", initial="a", transitions={"a": ["a", "b"]}, terminal=["b"])
    assert "themselves" in error.message
    assert "'a'" in error.message


def test_non_terminal_dead_end_with_empty_row_is_refused():
    """Refuses a non-terminal state whose row lists no targets."""
    error = _refused(
        name="m", initial="a", transitions={"a": ["b", "stuck"], "stuck": []}, terminal=["b"]
    )
    assert "without outgoing" in error.message
    assert "'stuck'" in error.message


def test_non_terminal_dead_end_without_row_is_refused():
    """Refuses an explicitly listed non-terminal state that has no row."""
    error = _refused(
        name="m",
        initial="a",
        transitions={"a": ["b", "stuck"]},
        terminal=["b"],
        states=["a", "b", "stuck"],
    )
    assert "without outgoing" in error.message
    assert "'stuck'" in error.message


def test_initial_terminal_state_is_refused():
    """Refuses a machine whose initial state is terminal."""
    error = _refused(name="m", initial="done", transitions={}, terminal=["done"])
    assert "initial" in error.message
    assert "'done'" in error.message


def test_unreachable_states_are_refused():
    """Refuses states that cannot be reached from the initial state."""
    error = _refused(
        name="m",
        initial="a",
        transitions={"a": ["b"], "island": ["b", "lagoon"], "lagoon": ["b"]},
        terminal=["b"],
    )
    assert "unreachable" in error.message
    assert "'island'" in error.message
    assert "'lagoon'" in error.message


def test_unreachable_terminal_state_is_refused():
    """Refuses a terminal state that no transition leads to."""
    error = _refused(name="m", initial="a", transitions={"a": ["b"]}, terminal=["b", "orphan"])
    assert "unreachable" in error.message
    assert "'orphan'" in error.message


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"terminal": "b"}, "terminal states"),
        ({"transitions": {"a": "b"}}, "targets of 'a'"),
        ({"transitions": [("a", ["b"])]}, "transitions"),
        ({"transitions": {"a": ["b", 3]}}, "int"),
        ({"transitions": {1: ["b"]}}, "transitions key"),
        ({"initial": None}, "initial state"),
        ({"name": 7}, "name"),
    ],
)
def test_malformed_arguments_are_refused(kwargs, fragment):
    """Refuses arguments of the wrong shape instead of misreading them."""
    arguments = {"name": "m", "initial": "a", "transitions": {"a": ["b"]}, "terminal": ["b"]}
    error = _refused(**(arguments | kwargs))
    assert fragment in error.message


def test_direct_construction_is_validated_too():
    """Validates a machine built through the dataclass constructor."""
    with pytest.raises(InvalidDefinition) as caught:
        StateMachine(
            name="m",
            initial="a",
            states=frozenset({"a", "b"}),
            terminal=frozenset({"b"}),
            transitions={"a": frozenset({"ghost"})},
        )
    assert "'ghost'" in caught.value.message


def test_machine_is_immutable():
    """Keeps a built machine and its transition table read-only."""
    machine = _small()
    with pytest.raises(dataclasses.FrozenInstanceError):
        machine.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        machine.transitions["start"] = frozenset()  # type: ignore[index]


def test_input_mutation_after_definition_has_no_effect():
    """Copies its inputs so later mutation of them cannot change the machine."""
    table = {"start": ["middle", "done"], "middle": ["done"]}
    machine = StateMachine.define(
        name="small", initial="start", transitions=table, terminal=["done"]
    )
    before = machine.version
    table["start"].append("ghost")
    assert machine.can_transition("start", "ghost") is False
    assert machine.version == before


def test_default_lifecycle_matches_the_documented_table():
    """Ships the documented default lifecycle exactly."""
    assert DEFAULT_LIFECYCLE.initial == "intake"
    assert DEFAULT_LIFECYCLE.terminal == LIFECYCLE_TERMINAL
    assert DEFAULT_LIFECYCLE.states == set(LIFECYCLE_STATES)
    assert dict(DEFAULT_LIFECYCLE.transitions) == LIFECYCLE_TABLE


@pytest.mark.parametrize(
    ("terminal", "target"), list(itertools.product(sorted(LIFECYCLE_TERMINAL), LIFECYCLE_STATES))
)
def test_default_lifecycle_terminal_states_refuse_every_transition(terminal, target):
    """Refuses every move out of every terminal state of the default lifecycle."""
    assert DEFAULT_LIFECYCLE.is_terminal(terminal)
    assert DEFAULT_LIFECYCLE.targets(terminal) == frozenset()
    assert DEFAULT_LIFECYCLE.can_transition(terminal, target) is False
    with pytest.raises(InvalidTransition) as caught:
        DEFAULT_LIFECYCLE.assert_transition(terminal, target)
    assert f"'{terminal}'" in caught.value.message
    assert f"'{target}'" in caught.value.message
    assert "terminal" in caught.value.message


@pytest.mark.parametrize(
    ("current", "target"),
    [(source, target) for source, targets in LIFECYCLE_TABLE.items() for target in targets],
)
def test_default_lifecycle_allows_every_documented_edge(current, target):
    """Allows every documented edge of the default lifecycle."""
    assert DEFAULT_LIFECYCLE.can_transition(current, target)
    DEFAULT_LIFECYCLE.assert_transition(current, target)


def test_default_lifecycle_allows_decision_back_to_executing():
    """Allows a human decision to send the workflow back to executing."""
    assert DEFAULT_LIFECYCLE.can_transition("decision", "executing")
    DEFAULT_LIFECYCLE.assert_transition("decision", "executing")


def test_default_lifecycle_refuses_intake_to_completed():
    """Refuses intake -> completed and names both states and the machine."""
    assert DEFAULT_LIFECYCLE.can_transition("intake", "completed") is False
    with pytest.raises(InvalidTransition) as caught:
        DEFAULT_LIFECYCLE.assert_transition("intake", "completed")
    error = caught.value
    assert error.code == "INVALID_TRANSITION"
    assert "'intake'" in error.message
    assert "'completed'" in error.message
    assert error.details == {
        "current": "intake",
        "target": "completed",
        "machine": "default_lifecycle",
    }


@pytest.mark.parametrize(("current", "target"), [("intake", "ghost"), ("ghost", "intake")])
def test_unknown_states_are_invalid_transitions(current, target):
    """Reports a move involving an unknown state as an invalid transition."""
    assert DEFAULT_LIFECYCLE.can_transition(current, target) is False
    with pytest.raises(InvalidTransition) as caught:
        DEFAULT_LIFECYCLE.assert_transition(current, target)
    assert "'ghost'" in caught.value.message
    assert "'intake'" in caught.value.message
    assert "unknown" in caught.value.message


def test_queries_about_unknown_states_are_invalid_input():
    """Refuses to answer targets or is_terminal for an unknown state."""
    with pytest.raises(InvalidInput, match="'ghost'"):
        DEFAULT_LIFECYCLE.targets("ghost")
    with pytest.raises(InvalidInput, match="'ghost'"):
        DEFAULT_LIFECYCLE.is_terminal("ghost")


def test_is_terminal_distinguishes_live_states():
    """Reports live states as non-terminal."""
    assert not any(DEFAULT_LIFECYCLE.is_terminal(state) for state in LIFECYCLE_TABLE)


def test_long_unknown_state_is_clipped_in_messages():
    """Clips an oversized unknown state name in messages and details."""
    with pytest.raises(InvalidTransition) as caught:
        DEFAULT_LIFECYCLE.assert_transition("intake", "x" * 10_000)
    assert len(caught.value.message) < 400
    assert len(str(caught.value.details["target"])) < 100


def test_version_is_a_content_hash_of_the_canonical_form():
    """Derives the version from the canonical JSON form."""
    assert DEFAULT_LIFECYCLE.version == content_hash(DEFAULT_LIFECYCLE.to_json())
    assert DEFAULT_LIFECYCLE.version.startswith("sha256:")


def test_version_ignores_input_ordering():
    """Gives the same version whatever order the inputs arrive in."""
    reordered = StateMachine.define(
        name="default_lifecycle",
        initial="intake",
        transitions={
            state: sorted(targets, reverse=True)
            for state, targets in reversed(list(LIFECYCLE_TABLE.items()))
        },
        terminal=sorted(LIFECYCLE_TERMINAL, reverse=True),
        states=sorted(LIFECYCLE_STATES, reverse=True),
    )
    assert reordered.version == DEFAULT_LIFECYCLE.version
    assert reordered == DEFAULT_LIFECYCLE
    assert hash(reordered) == hash(DEFAULT_LIFECYCLE)


def test_version_changes_when_any_edge_changes():
    """Changes the version whenever any single edge is added or removed."""
    for source in LIFECYCLE_TABLE:
        for target in LIFECYCLE_STATES:
            table = {state: set(targets) for state, targets in LIFECYCLE_TABLE.items()}
            table[source] ^= {target}
            try:
                changed = StateMachine.define(
                    name="default_lifecycle",
                    initial="intake",
                    transitions=table,
                    terminal=LIFECYCLE_TERMINAL,
                )
            except InvalidDefinition:
                continue
            assert changed.version != DEFAULT_LIFECYCLE.version, (source, target)
            assert changed != DEFAULT_LIFECYCLE


def test_version_changes_with_name_initial_and_terminal_set():
    """Changes the version when the name, initial state or terminal set changes."""
    base = _small()
    renamed = StateMachine.define(
        name="other", initial="start", transitions=base.transitions, terminal=base.terminal
    )
    reinitialised = StateMachine.define(
        name="small",
        initial="middle",
        transitions={"start": ["done"], "middle": ["start"]},
        terminal=["done"],
    )
    two_ends = StateMachine.define(
        name="small",
        initial="start",
        transitions={"start": ["middle", "done"], "middle": ["done", "end"]},
        terminal=["done", "end"],
    )
    versions = {base.version, renamed.version, reinitialised.version, two_ends.version}
    assert len(versions) == 4


def test_to_json_is_canonical():
    """Emits sorted lists and rows only for non-terminal states."""
    assert _small().to_json() == {
        "name": "small",
        "initial": "start",
        "states": ["done", "middle", "start"],
        "terminal": ["done"],
        "transitions": {"middle": ["done"], "start": ["done", "middle"]},
    }


def test_json_round_trip_preserves_version():
    """Rebuilds an identical machine from its JSON form, also via JSON text."""
    rebuilt = StateMachine.from_json(DEFAULT_LIFECYCLE.to_json())
    assert rebuilt == DEFAULT_LIFECYCLE
    assert rebuilt.version == DEFAULT_LIFECYCLE.version
    parsed = parse_json(canonical_json(DEFAULT_LIFECYCLE.to_json()))
    assert isinstance(parsed, dict)
    assert StateMachine.from_json(parsed).version == DEFAULT_LIFECYCLE.version


def test_to_json_returns_a_fresh_copy():
    """Hands out a copy, so mutating it cannot change the machine."""
    data = _small().to_json()
    data["transitions"]["start"].append("ghost")
    assert _small().to_json()["transitions"]["start"] == ["done", "middle"]


@pytest.mark.parametrize(("key", "present"), [("states", False), ("version", True)])
def test_from_json_requires_exactly_the_canonical_keys(key, present):
    """Refuses stored JSON with a missing or unexpected key."""
    data: dict[str, object] = dict(_small().to_json())
    if present:
        data[key] = "sha256:00"
    else:
        del data[key]
    with pytest.raises(InvalidDefinition, match=f"'{key}'"):
        StateMachine.from_json(data)


def test_from_json_revalidates_the_graph():
    """Refuses stored JSON whose graph breaks a rule."""
    data = _small().to_json()
    data["transitions"]["middle"].append("ghost")
    with pytest.raises(InvalidDefinition, match="'ghost'"):
        StateMachine.from_json(data)


def test_from_json_refuses_states_missing_from_the_state_list():
    """Refuses stored JSON whose state list omits a state it uses."""
    data = _small().to_json()
    data["states"].remove("middle")
    with pytest.raises(InvalidDefinition, match="'middle'"):
        StateMachine.from_json(data)


def test_from_json_refuses_non_objects():
    """Refuses stored JSON that is not an object."""
    with pytest.raises(InvalidDefinition):
        StateMachine.from_json(["not", "an", "object"])  # type: ignore[arg-type]


names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)


@st.composite
def valid_machines(draw: st.DrawFn) -> tuple[str, dict[str, set[str]], set[str]]:
    """Draw a chain of live states ending in a terminal, plus random extra edges."""
    pool = draw(st.lists(names, min_size=2, max_size=8, unique=True))
    live_count = draw(st.integers(min_value=1, max_value=len(pool) - 1))
    live, ends = pool[:live_count], pool[live_count:]
    chain = [*live, ends[0]]
    table = {state: {chain[index + 1]} for index, state in enumerate(live)}
    for end in ends[1:]:
        table[draw(st.sampled_from(live))].add(end)
    candidates = [(source, target) for source in live for target in pool if source != target]
    for source, target in draw(st.lists(st.sampled_from(candidates), max_size=12)):
        table[source].add(target)
    return live[0], table, set(ends)


@given(valid_machines())
def test_can_transition_agrees_with_the_table(spec):
    """Allows exactly the edges of the table and raises for every other pair."""
    initial, table, terminal = spec
    machine = StateMachine.define(
        name="generated", initial=initial, transitions=table, terminal=terminal
    )
    probes = [*machine.states, "ghost_state"]
    for current, target in itertools.product(probes, probes):
        expected = target in table.get(current, set())
        assert machine.can_transition(current, target) is expected
        try:
            machine.assert_transition(current, target)
        except InvalidTransition:
            raised = True
        else:
            raised = False
        assert raised is not expected


@given(valid_machines(), st.randoms(use_true_random=False))
def test_version_is_invariant_under_shuffling(spec, rng):
    """Gives a shuffled copy of a generated definition the same version."""
    initial, table, terminal = spec
    original = StateMachine.define(
        name="generated", initial=initial, transitions=table, terminal=terminal
    )
    rows = list(table.items())
    rng.shuffle(rows)
    shuffled_rows = {state: rng.sample(sorted(targets), len(targets)) for state, targets in rows}
    ends = rng.sample(sorted(terminal), len(terminal))
    shuffled = StateMachine.define(
        name="generated", initial=initial, transitions=shuffled_rows, terminal=ends
    )
    assert shuffled.version == original.version
    assert StateMachine.from_json(shuffled.to_json()).version == original.version
