"""Which void gate the learner runs again: a gate that could not judge (engine faults, too few
pairs scored in both arms; reef.gate.evaluate) leaves its candidate in state `gate_void`, and the
learner gates the candidate of a scenario's latest round again, before any new round, at most
`learner.gate_retries` times (the round process does it: `RoundRequest.regate`).

The tries are counted in the candidate register (its void gates in a row), not in memory, so a
restarted learner spends no more than the budget; a gate that judged since (a retry, `reef gate`),
or a person's rejection, ends the retries.
"""

from __future__ import annotations

from typing import Any

from reef.learn.plan import RoundPlan
from reef.learn.round_log import RoundLog
from reef.registry.candidates import CandidateNotFoundError, CandidateRegistry


def void_retry(plan: RoundPlan, log: RoundLog, budget: int) -> tuple[str | None, dict[str, Any] | None]:
    """(the candidate to gate again, or None when there is none or its budget is spent; where it
    stands, for the learner's status, or None when the latest round's gate was not void)."""
    rnd = log.current()
    if rnd is None or rnd.decision != "void" or rnd.candidate_id is None:
        return None, None
    cid = rnd.candidate_id
    registry = CandidateRegistry(plan.data_dir, plan.scenario)
    try:
        state = registry.get(cid).state
    except CandidateNotFoundError:  # not in the register (removed by hand): nothing to gate
        return None, None
    if state != "gate_void":  # judged since (a retry, `reef gate`), or rejected by a person
        return None, None
    gates = [ev.data for ev in registry.events() if ev.candidate_id == cid and ev.event == "evaluated"]
    voids = 0
    for gate in reversed(gates):
        if gate.get("decision") != "void":
            break
        voids += 1
    retries = max(0, voids - 1)  # the first void gate was the round's own
    left = budget - retries
    where = {"candidate_id": cid, "retries": retries, "gate_retries": budget,
             "reason": gates[-1].get("reason") if gates else None,
             "next": (f"gated again before the next round ({left} of {budget} retries left)" if left > 0
                      else f"left void after {retries} retries; gate it again with `reef gate {cid[:12]}`")}
    return (cid if left > 0 else None), where
