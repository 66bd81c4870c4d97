"""`serve.yaml`'s `learner:` section: when rounds run, the ladder's rungs (harness, exploration), how a
round's engine requests share the engine with users, and how its training is launched."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from reef.config.strict import Strict as _Strict


class ExploreSettings(_Strict):
    """The learner's first rung when live rewards are rare (reef.learn.ladder): an exploration round
    (recipe `explore`: the policy's own rollouts on the scenario's practice tasks, scored by its
    reward, the successes fine-tuned) instead of waiting, for a scenario whose own recipe waits for
    rewarded records, trains a LoRA, and which declares a reward and `tasks:` (no environment)."""

    enabled: bool = Field(default=True, description="false: a scenario's round only ever waits for live rewards")
    recipe: str = Field(default="explore", description="the exploration recipe: a built-in name or module:Class")
    params: dict[str, Any] = Field(default_factory=dict, description="its config's fields (samples, temperature, "
                                   "max_prompts, guided, ...)")
    min_reports: int = Field(default=16, ge=1, description="reported live records, fewer than min_rewarded of them "
                             "rewarded, before rewards count as rare")
    live_horizon_s: float | None = Field(default=300.0, gt=0, description="explore only when live traffic, at the "
                                         "rate reports and rewards arrived over the last two minutes, would take "
                                         "longer than this to bring the rewarded records the own recipe waits for; "
                                         "null: as soon as rewards are rare")
    retry_s: float = Field(default=300.0, gt=0, description="the wait after an exploration round before the next; "
                           "doubled after each that released nothing (up to 8x)")
    rl_recipe: str | None = Field(default="grpo", description="the on-policy RL recipe an exploration round "
                                  "becomes once successes are not rare; null: always `recipe`")
    rl_params: dict[str, Any] = Field(default_factory=dict, description="its config's fields (num_generations, "
                                      "prompts_per_step, max_steps, ...)")
    rl_above: float = Field(default=0.25, gt=0, le=1, description="the share of the last exploration round's "
                            "unguided rollouts that passed at or above which the next one is `rl_recipe`'s")

    @model_validator(mode="before")
    @classmethod
    def _flag(cls, data: Any) -> Any:
        return {"enabled": data} if isinstance(data, bool) else data


class ShareSettings(_Strict):
    """How a round's engine requests (rollouts, the gate's replies) share the engine with users
    (reef.sampling.sharing): counted in sequences, a request's `n` choices being `n`."""

    beside_users: int | None = Field(default=2, ge=1, description="a round's sequences in flight while the engine "
                                     "serves anyone else (at least); null: no yielding (a GPU engine with room to "
                                     "spare)")
    per_user: float = Field(default=0.5, ge=0, description="beside users, this many of a round's sequences per user "
                            "call in flight when that is more than `beside_users` (0.5: at most a third of the batch)")
    alone: int | None = Field(default=8, ge=1, description="a round's sequences in flight while it serves no one "
                              "else (a user who arrives waits behind them); null: the recipe's or gate's concurrency")


class HarnessRungSettings(_Strict):
    """The learner's rung before exploration (reef.learn.harness_rung): while a scenario's own recipe
    still waits for rewarded records but a few are in, a harness round (recipe `harness_evolve`,
    proposer `mined`) shows them as few-shot examples, gated and released like any candidate. Once
    per head release, for a scenario whose head harness has no examples yet and whose harness the
    gateway applies (`harness.inject` not `off`)."""

    enabled: bool = Field(default=True, description="false: the ladder starts at exploration")
    recipe: str = Field(default="harness_evolve", description="the harness recipe: a built-in name or module:Class")
    params: dict[str, Any] = Field(default_factory=dict, description="its config's fields (max_shots, ...); the "
                                   "rung sets proposer mined, failure_below to the own recipe's threshold and "
                                   "consume false unless given here")
    min_rewarded: int = Field(default=2, ge=1, description="rewarded records (as the own recipe counts them) before "
                              "a harness round, fewer than the own recipe's min_rewarded")

    @model_validator(mode="before")
    @classmethod
    def _flag(cls, data: Any) -> Any:
        return {"enabled": data} if isinstance(data, bool) else data


class AccelerateSettings(_Strict):
    """How `learner.launcher: accelerate` starts a round's training (reef.learn.launch): through
    Hugging Face accelerate, one process per device, the same TRL recipe in each."""

    num_processes: int = Field(default=2, ge=1, description="training processes (without config_file): DDP over "
                               "gloo on CPU, one per GPU on a GPU box")
    config_file: Path | None = Field(default=None, description="an accelerate config file (`accelerate config`): "
                                     "DDP, FSDP or DeepSpeed, several machines; it decides the processes")
    main_process_port: int | None = Field(default=None, ge=1, le=65535, description="the rendezvous port on "
                                          "127.0.0.1; unset: a free one")


class LearnerConfig(_Strict):
    """The learner `reef serve` runs: rounds for every scenario that declares a recipe
    (`scenarios.<s>.recipe`, a name in `recipes:`), whenever enough new experience waits."""

    enabled: bool = False
    interval_s: float = Field(default=30.0, gt=0, description="how often to check for pending experience")
    # A round waits for enough signal, not for the first record: each count is of the eligible new
    # records (unconsumed, trainable, reported when the recipe needs reports). A recipe setting
    # (`recipes.<name>`) overrides each; a count the recipe does not learn from (rft trains on rewarded
    # records only, next_turn reads no reports, a harness recipe learns from failures; `Recipe.waits_for`)
    # is not waited for unless its setting names it.
    min_records: int = Field(default=16, ge=1, description="eligible new records (those the round's snapshot would "
                             "take, uncapped by batch_size) that start a round, unless the scenario's recipe sets "
                             "min_records; left unset, a recipe that learns from rewarded records only (rft) "
                             "waits for min_rewarded of them instead")
    min_rewarded: int = Field(default=4, ge=0, description="of them, records with a reward: above 0, or at least the "
                              "recipe's min_score (rft: 1.0; kto: threshold; harness recipes: failure_below), "
                              "unless the recipe sets min_rewarded")
    min_unrewarded: int = Field(default=4, ge=0, description="records reported with a reward of 0 (or below the "
                                "recipe's min_score / failure_below), unless the recipe sets min_unrewarded")
    gate_retries: int = Field(default=2, ge=0, description="times a candidate whose gate was void (engine faults, "
                              "too few scored pairs: no judgement) is gated again, one try per interval before any "
                              "new round of its scenario; then it stays void until someone runs `reef gate`")
    harness: HarnessRungSettings = Field(default_factory=HarnessRungSettings, description="a harness round "
                                         "showing the first rewarded replies as few-shot examples (false: off)")
    explore: ExploreSettings = Field(default_factory=ExploreSettings, description="exploration rounds while live "
                                     "rewards are rare (false: off)")
    round_nice: int = Field(default=10, ge=0, le=19, description="the niceness added to each round process (training, "
                            "the gate's scoring): on a few cores the engine and the gateway, which serve users, "
                            "win the CPU while a round trains; 0: the round runs at the server's priority")
    share: ShareSettings = Field(default_factory=ShareSettings, description="users first: how many of a round's "
                                 "engine requests run beside users' ones")
    launcher: Literal["process", "accelerate"] = Field(default="process", description="how a round trains: in the "
                                                       "round process; or through Hugging Face accelerate "
                                                       "(`accelerate`), several processes (reef.learn.launch)")
    accelerate: AccelerateSettings = Field(default_factory=AccelerateSettings, description="with launcher "
                                           "accelerate: its processes or config file")

    @model_validator(mode="before")
    @classmethod
    def _no_params_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and "params" in data:
            raise ValueError("learner.params was removed: the server's learner takes each scenario's recipe from "
                             "serve.yaml (`recipes.<name>: {recipe, batch_size, max_staleness, params}` and "
                             "`scenarios.<s>.recipe: <name>`); params.yaml stays the DVC pipeline's parameter file")
        return data
