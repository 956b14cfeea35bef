"""Aux layer ids: the one owner of their default, their rules and the config type every stage declares.

Aux id k = the residual stream entering decoder layer k (vLLM's and speculators' convention); the default
is (2, N//2, N-3). Every stage that takes or reads aux ids (extract, train, doctor, export, import, eval)
checks them here, so a bad list fails with the same words everywhere, and before any weights load:
  - an explicit non-empty list of ints (an engine silently uses its own defaults when the list is absent),
  - strictly increasing (so no repeats): vLLM sorts the ids when it captures, so an unsorted list would
    permute fc's input blocks at serving time while training saw another order,
  - each in 0..N-1 for an N-layer target,
  - len(ids) x target hidden == the draft's fc input width, when a draft is involved.
Pure Python (no torch, no pydantic), so configs, the pure-torch draft model and the export contract all import it.
"""

from __future__ import annotations

from typing import Any

KEY = "aux_layer_ids"     # the one name: CLI flag (--aux-layer-ids), manifests, draft configs


class AuxLayerIdsError(ValueError):
    """Aux layer ids that no engine would serve correctly; the message names the rule and the fix."""


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default: (2, N//2, N-3); aux id k is the residual stream entering layer k."""
    if num_layers < 1:
        raise ValueError(f"a target needs at least one decoder layer, got {num_layers}")
    ids = [2, num_layers // 2, num_layers - 3]
    if ids[0] < ids[1] < ids[2] < num_layers:
        return ids
    # Too shallow for the standard triple (N < 7 repeats, reorders or leaves the range): spread up to three
    # distinct ids evenly over the stack instead (first layer, middle, last).
    return sorted({round(j * (num_layers - 1) / 2) for j in range(3)})


def aux_layer_id_problems(ids: Any, num_layers: int | None = None, *, fc_in: int | None = None,
                          hidden_size: int | None = None, key: str = KEY) -> list[str]:
    """Every rule `ids` breaks, one message each (empty = usable). `key` names where the ids came from."""
    if not isinstance(ids, (list, tuple)) or not ids or \
            not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return [f"{key}: must be an explicit non-empty list of ints, got {ids!r} "
                f"(vLLM silently uses its default ids when it is absent)"]
    ids = list(ids)
    out = []
    if sorted(set(ids)) != ids:
        out.append(f"{key}: {ids} must be strictly increasing (no repeats): vLLM captures the layers in sorted "
                   f"order, so fc's input blocks would be permuted; use {sorted(set(ids))}")
    bad = [i for i in ids if i < 0 or (num_layers is not None and i >= num_layers)]
    if bad:
        valid = f"0..{num_layers - 1}" if num_layers is not None else "ids >= 0"
        out.append(f"{key}: {bad} out of range: the target has {num_layers} decoder layers (valid {valid}; "
                   f"id k = the residual stream entering layer k)")
    if fc_in is not None and hidden_size and fc_in != len(ids) * hidden_size:
        out.append(f"{key}: aux count != fc width: {len(ids)} aux layers x hidden {hidden_size} = "
                   f"{len(ids) * hidden_size}, but fc.weight takes {fc_in} inputs ({fc_in / hidden_size:g} layers)")
    return out


def check_aux_layer_ids(ids: Any, num_layers: int | None = None, *, fc_in: int | None = None,
                        hidden_size: int | None = None, key: str = KEY) -> list[int]:
    """`ids` as a list when every rule holds, else AuxLayerIdsError naming each broken rule."""
    problems = aux_layer_id_problems(ids, num_layers, fc_in=fc_in, hidden_size=hidden_size, key=key)
    if problems:
        raise AuxLayerIdsError("; ".join(problems))
    return [int(i) for i in ids]


def choose_aux_layer_ids(given: list[int] | None, num_layers: int, *, recorded: list[int] | None = None,
                         recorded_where: str = "the input") -> tuple[list[int], str]:
    """(ids, where they came from): the flag, else what the input recorded (store manifest, draft), else the
    default. Not checked here: `resolve_aux_layer_ids` raises on a broken list, doctor reports it."""
    if given:
        return list(given), "--aux-layer-ids"
    if recorded:
        return list(recorded), recorded_where
    return default_aux_layer_ids(num_layers), "default (2, N//2, N-3)"


def resolve_aux_layer_ids(given: list[int] | None, num_layers: int, *, recorded: list[int] | None = None,
                          recorded_where: str | None = None) -> list[int]:
    """The ids a stage uses (`choose_aux_layer_ids`), checked against the rules above.

    A flag that contradicts recorded ids fails (states captured at other layers would train garbage)."""
    ids = check_aux_layer_ids(choose_aux_layer_ids(given, num_layers, recorded=recorded)[0], num_layers)
    if given and recorded is not None and list(recorded) != ids:
        raise AuxLayerIdsError(f"--aux-layer-ids {ids} differ from the aux ids {list(recorded)} recorded in "
                               f"{recorded_where or 'the input'}; drop the flag or use the recorded ids")
    return ids

